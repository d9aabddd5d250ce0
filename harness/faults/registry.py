"""The faults' registry: each fault is registered by `@fault` on its own code, with what it breaks, and found here by
name. Torch-free, so listing the faults (`harness --help`, a plan's check) imports nothing heavy: each fault imports
torch and diffusers inside its body."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from harness.core.errors import HarnessError
from harness.core.registry import Registry

MODULE_PATH = "<module path>"  # how a targeted fault's argument is written for people (`scale_output:<module path>`)


@dataclass(frozen=True)
class Fault:
    name: str
    description: str  # what it breaks, for people
    start: Callable[..., AbstractContextManager]  # its code: a context manager, given the module path if targeted
    targeted: bool = False  # aimed at one module (`name:module.path`), so localization must name that module
    model_change: bool = False  # a change to diffusers itself: the single-device baseline runs with it too

    @property
    def family(self) -> str:
        """The module of harness.faults that holds it (cp, tp, backends, ...)."""
        return self.start.__module__.rpartition(".")[2]

    @property
    def usage(self) -> str:
        """How `--inject-fault` takes it."""
        return f"{self.name}:{MODULE_PATH}" if self.targeted else self.name


REGISTERED: Registry[Fault] = Registry("fault", "HARNESS_FAULTS")


def fault(description: str, *, targeted: bool = False, model_change: bool = False):
    """Register the decorated function as the fault of its own name; the function is returned unchanged."""
    def register(start: Callable[..., AbstractContextManager]) -> Callable[..., AbstractContextManager]:
        REGISTERED.add(start.__name__, Fault(start.__name__, description, start, targeted, model_change),
                       start.__module__)
        return start

    return register


def usages() -> list[str]:
    """Every fault as `--inject-fault` takes it, the targeted ones last."""
    ordered = sorted(REGISTERED.values(), key=lambda found: found.targeted)
    return [found.usage for found in ordered]


def find(name: str) -> tuple[Fault, str]:
    """The fault an `--inject-fault` value names, and its module path ('' when it is not targeted); a HarnessError
    listing the valid values for anything else."""
    base, colon, target = name.partition(":")
    found = REGISTERED.get(base)
    if found is None or found.targeted != bool(colon) or (colon and not target):
        raise HarnessError(REGISTERED.unknown(name, usages()))
    return found, target


def check(name: str) -> None:
    find(name)


def is_model_change(name: str | None) -> bool:
    found = REGISTERED.get((name or "").partition(":")[0])  # a targeted one by its name before the module path
    return found is not None and found.model_change


@contextlib.contextmanager
def active(name: str | None):
    """The fault `name` in force for the block, for one case in one worker process (None: none)."""
    if name is None:
        yield
        return
    found, target = find(name)
    with found.start(target) if found.targeted else found.start():
        yield
