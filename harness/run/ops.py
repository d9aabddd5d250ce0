"""`--localize-ops`: inside the first module where one device left its stored reference (harness.engine.drift), the
first aten op that moved (harness.rank.opdiff), found in this process on one device.

Per-op records need both sides running: the change, and code that reproduces the reference. In a run that injects a
change to diffusers (a `model_change` fault, which the single-device runs have too), the same code without the fault
stands for the reference's side (on the reference's platform a clean run reproduces it bit for bit); a change that
is this environment's own (another diffusers or torch than the reference's) has no other side here, and the line
says so."""

from __future__ import annotations

from pathlib import Path

from harness import faults
from harness.core import axes
from harness.core.results import CaseResult
from harness.run import reference_drift


def localize_ops(results: list[CaseResult], references: Path, echo) -> None:
    """For each reference one device moved off (once), the first op that moved inside its first moved module: kept
    under each such case's `extra.drift.ops` and said."""
    done: dict[tuple, str] = {}
    for result in results:
        line = reference_drift.moved(result)
        if line is None or "forward" not in result.extra["drift"] or line.startswith("backward: "):
            continue
        fault = axes.parse(result.case_id)["fault"]
        key = (result.model, result.shape, result.kind, fault)
        if key not in done:
            done[key] = _ops(result, fault, references, _module_of(line))
            echo(f"ops: {result.model}@{result.shape} {result.kind}: {done[key]}")
        result.extra["drift"] = {**result.extra["drift"], "ops": done[key]}


def _module_of(line: str) -> str:
    """The module a drift line names: `transformer_blocks.0.attn (first seen at ...): ...` -> its name."""
    return line.split(":")[0].split(" (")[0]


def _ops(result: CaseResult, fault: str | None, references: Path, module: str) -> str:
    if not faults.is_model_change(fault):
        return (f"per-op needs the reference's side running, and this environment's own change has none here (the "
                f"reference's revision runs in an environment of its own: `harness ab`); first moved module: {module}")
    import torch

    from harness.core.reference import read_reference, reference_path
    from harness.kinds import kind_of
    from harness.kinds.capturing import one_device_case
    from harness.rank import backends, loading, opdiff

    kind = kind_of(kind_of(result.kind).reference_kind)
    reference = read_reference(reference_path(references, result.model, result.shape, kind.name))
    case = one_device_case(kind.name, result.model, result.shape)

    def ops(fault: str | None) -> list[dict]:
        with faults.active(fault):
            built = kind.build(case, reference, torch.device("cpu"), loading.enabled())
            try:
                return opdiff.record(built.module, module, built.forward or built.run)
            finally:
                backends.reset_active_backend()

    found = opdiff.first_difference(ops(fault), ops(None))
    return opdiff.line(found, module) + f" (against the same code without {fault})"
