"""One shape for the harness's registries: kinds, loads, flows and faults are each a `Registry` of values by name.

A value is added once (a name registered twice names both places, a programming error); it is looked up with one
error for an unknown name, which lists the valid ones and the closest; and values of your own come from the modules
an environment variable names (`HARNESS_KINDS`, `HARNESS_LOADS`, `HARNESS_FLOWS`, `HARNESS_FAULTS`: comma-separated,
importable from every rank), imported with the registry's package. Torch-free.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Iterable
from typing import TypeVar

from harness.core.errors import HarnessError

T = TypeVar("T")


class Registry(dict[str, T]):
    """Values by name, `what` they are ("load") and the environment variable that adds your own."""

    def __init__(self, what: str, env: str):
        super().__init__()
        self.what, self.env = what, env
        self.owners: dict[str, str] = {}  # the module each value was registered from

    def add(self, name: str, value: T, owner: str) -> T:
        """`value` under `name`, registered from module `owner`; a name taken, or none, is a ValueError."""
        if not name or name in self:
            raise ValueError(f"{self.what} {name!r} is registered twice: in {self.owners.get(name)} and in {owner}"
                             if name else f"a {self.what} of {owner} has no name")
        self[name], self.owners[name] = value, owner
        return value

    def of(self, name: str) -> T:
        """The value of `name`, or a HarnessError naming the valid ones."""
        if name not in self:
            raise HarnessError(self.unknown(name))
        return self[name]

    def unknown(self, name: str, valid: Iterable[str] | None = None) -> str:
        """What to say of a name that is not one: the valid ones (`valid`, or every name), and the closest."""
        valid = list(self if valid is None else valid)
        close = difflib.get_close_matches(name, valid, n=1)
        return (f"unknown {self.what} {name!r}; valid {self.what}s: {', '.join(valid)}"
                + (f" (did you mean {close[0]!r}?)" if close else ""))

    def import_own(self) -> None:
        """Import the modules `env` names, each registering values of its own."""
        for module in filter(None, (name.strip() for name in os.environ.get(self.env, "").split(","))):
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise HarnessError(f"{self.env}: cannot import {self.what} module {module!r} ({error})") from None
