"""Repeat determinism: the case run a second time in the same launch, on every rank, as its first run was (the same
built model, the proof's recording around it), and what each rank ends with compared bit for bit with the first.

A layout that does not repeat itself has a rank whose numbers depend on more than its inputs (an unordered
reduction, a race, a stale buffer): where one differs, every rank traces two more runs with every module
fingerprinted (harness.rank.fingerprint, its own pieces) and the first module, in execution order, whose output
differed between them is named with its rank. Eager cases of kinds whose run repeats without side effects
(`Kind.repeats`), without a flow (a flow's state is its own to judge); said as not checked otherwise.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from harness import flows
from harness.core.modes import EAGER
from harness.core.records import Case
from harness.engine.context import RankContext
from harness.kinds import kind_of
from harness.rank import backends, fingerprint, moved
from harness.rank.recorder import RunRecorder


def check(context: RankContext, case: Case, built, first) -> dict | None:
    """On every rank: the case once more, against its first output; on rank 0, every rank's figures ({"max_abs",
    "ranks", "seconds", "module"}); None where it is not checked."""
    kind = kind_of(case.kind)
    if not getattr(kind, "repeats", False) or case.mode != EAGER or case.flow != flows.NONE:
        return None
    started = time.perf_counter()
    try:
        with context.torch_context_parallel(case, built):
            second = built.run_recorded(RunRecorder(built.module, built.kernel_scope))
        mine = _difference(kind.comparable(_local(first)), kind.comparable(_local(second)))
    except Exception as error:  # noqa: BLE001 - said with the case; the first run's numbers stand
        mine = f"the second run failed: {backends.first_line(error)}"
    finally:
        backends.reset_active_backend()
    ranks = _gathered(mine, case.world_size)
    module = _first_module(context, case, built) if any(value != 0.0 for value in ranks) else None
    numbers = [value for value in ranks if isinstance(value, float)]
    return {"max_abs": max(numbers) if len(numbers) == len(ranks) else None, "ranks": ranks, "module": module,
            "seconds": round(time.perf_counter() - started, 4)}


def _local(output):
    """What this rank holds of an output (a DTensor: its own piece; compared rank by rank)."""
    return output.to_local() if hasattr(output, "to_local") else output


def _difference(first: torch.Tensor, second: torch.Tensor) -> float:
    """0.0 for bit for bit equal (NaN where NaN), else the largest absolute difference (inf for another shape or a
    NaN on one side only)."""
    if first.shape != second.shape:
        return float("inf")
    if torch.equal(first.view(torch.int32) if first.dtype == torch.float32 else first,
                   second.view(torch.int32) if second.dtype == torch.float32 else second):
        return 0.0
    difference = (first.double() - second.double()).abs()
    return float("inf") if difference.isnan().any() else float(difference.max())


def _gathered(mine, world_size: int) -> list:
    if world_size == 1 or not dist.is_initialized():
        return [mine]
    found = [None] * world_size
    dist.all_gather_object(found, mine)
    return found


def _first_module(context: RankContext, case: Case, built) -> str | None:
    """Two more runs on every rank with every module fingerprinted: the first module whose output differed between
    them on some rank, as `rank 1: <module>: rel err ...`; a run that repeats itself then (an intermittent one) says
    so."""
    traces = []
    try:
        for _ in range(2):
            with context.torch_context_parallel(case, built):
                traces.append(fingerprint.record(built.module, built.forward or built.run)[0].parts())
        found = moved.compare(traces[0], traces[1], lambda part, name: fingerprint.RESOLUTION)["forward"]
        mine = (found.first, found.line) if found.line else None
    except Exception as error:  # noqa: BLE001 - said; the difference itself stands
        mine = (float("inf"), f"not traced: {backends.first_line(error)}")
    finally:
        backends.reset_active_backend()
    # the rank whose module differed first in execution order is where it arose (the others received it)
    named = sorted((found[0], rank, found[1]) for rank, found in enumerate(_gathered(mine, case.world_size)) if found)
    if not named:
        return ("every module repeated itself in two traced runs (an intermittent difference, or one after the last "
                "module or in the backward)")
    first, *others = named
    later = ", ".join(f"rank {rank} at {line.partition(':')[0]}" for _, rank, line in others)
    then = f" (then {later})" if others else ""
    return f"rank {first[1]}: {first[2]}{then}"
