"""What an option is, for the options of a run (harness.run.settings) and those each kind declares for itself
(harness.kinds): one declaration gives a CLI flag, a pytest option and a `[tool.harness]` key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_KEYS = ("fp32", "bf16", "fp16")  # the keys of a per-dtype table of limits


@dataclass(frozen=True)
class Option:
    """One option: `name` is its key in `[tool.harness]` (or in `[tool.harness.<kind>]` for a kind's option, whose
    flag is then `--<kind>-<name>`), `default` its value when nobody gives one. A table (`is_table`) has one entry per
    dtype (`DTYPE_KEYS`), merged key by key, and no CLI flag."""

    name: str
    default: Any
    help: str
    is_list: bool = False
    is_table: bool = False
    choices: tuple[str, ...] = ()
    kind: str = ""  # the kind that owns it ("" for the run's own options)

    @property
    def key(self) -> str:
        """The flat name the CLI, pytest and the settings use: `train_steps` for the train kind's `steps`."""
        return f"{self.kind}_{self.name}" if self.kind else self.name

    def where(self) -> str:
        """Where it is written in pyproject.toml."""
        return f"[tool.harness.{self.kind}] {self.name}" if self.kind else f"[tool.harness] {self.name}"

    def owned_by(self, kind: str) -> Option:
        return Option(self.name, self.default, self.help, self.is_list, self.is_table, self.choices, kind)
