"""The interface every case kind implements, and the two small types it exchanges with the worker and the verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.records import Case
from harness.core.reference import Reference
from harness.core.results import CaseResult, Status


@dataclass
class Built:
    """A case ready to run on a rank: the module `enable_parallelism` applies to, and a call that runs it once."""

    module: Any
    run: Callable[[], Any]
    cp_plan: dict | None = None  # passed to `enable_parallelism` (None: the class's own `_cp_plan`)
    profile_scope: Any = None  # only attention kernels inside this module's forward are judged (None: all)


@dataclass(frozen=True)
class Policy:
    """The limits a case is judged by: its dtype's tolerance, the low-precision budget and the picture limits."""

    tolerance: float
    budget_factor: float
    image_limits: dict[str, float]
    budget_max_factor: float = 1.5


class Kind:
    """One kind of case. Subclasses fill every method; nothing outside `harness/kinds/` branches on the name."""

    name: str = ""
    help: str = ""
    cost_s: float = 0.4  # rough seconds of one case on one rank, to balance the parts of `--shard K/N`

    def unavailable(self) -> str | None:
        """Why this kind cannot run on this machine (a plan-time SKIP), or None."""
        return None

    def shapes(self, spec, wanted: list[str], weights_dir: str | None) -> list[tuple[str, str | None]]:
        """(shape, weights folder) of each case of this kind for a model."""
        raise NotImplementedError

    def split_lengths(self, case: Case) -> dict[str, int] | None:
        """The sequence lengths a context-parallel layout splits, when the plan can know them; None if it cannot."""
        return None

    def reference_hash(self, case: Case) -> str:
        """The config hash the case's reference must carry (a stale reference is an error, not a comparison)."""
        raise NotImplementedError

    def capture(self, model: str, shape: str, root: Path, force: bool = False,
                weights_dir: str | None = None) -> tuple[Path, bool]:
        """Write the fp32 single-device reference; returns its path and whether it was written (False: kept)."""
        raise NotImplementedError

    def reference_shapes(self, spec, weights_dir: str | None) -> list[str]:
        """Every reference `harness capture` / `pytest --ref` writes for a model."""
        return [shape for shape, _ in self.shapes(spec, ["all"], weights_dir)]

    def build(self, case: Case, reference: Reference, device) -> Built:
        raise NotImplementedError

    def detach(self, output) -> Any:
        """The output as kept for comparison after the case (a CPU tensor, a picture)."""
        raise NotImplementedError

    def measure(self, output, reference: Reference, baseline, case: Case, images_dir: Path | None) -> dict:
        """What this kind measures against the reference and the single-device baseline (a value, or its error)."""
        raise NotImplementedError

    def judge(self, result: CaseResult, metrics: dict, policy: Policy) -> tuple[Status, str]:
        """Fill the result's figures from `metrics` and say PASS or FAIL with the reason."""
        raise NotImplementedError

    def cell(self, result: CaseResult) -> str:
        """The figure the terminal matrix shows beside the status ('' for none)."""
        return f" {result.max_abs_err:.1e}" if result.max_abs_err is not None else ""
