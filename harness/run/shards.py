"""`--shard K/N`: one of N parts of the plan, for N CI jobs; `harness merge` puts their reports back together.

The parts are cut deterministically from the plan alone (the same options give the same parts on every job) and
balanced by predicted cost. The unit is one model at one world size: its cases share a launch, the model's
reference and its single-device baselines, so a part never pays twice for them, and each part starts at most one
launch per world size. Cases decided at plan time (SKIP, plan errors) cost nothing and go with their unit, so every
planned case lands in exactly one part.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from harness.core.errors import HarnessError
from harness.kinds import kind_of
from harness.run.plan import PlannedCase

STARTUP_S = 8.0  # one torchrun launch: imports, init and rendezvous (docs/measured.md)


@dataclass
class Shard:
    """The cases of part `index` of `count`, in plan order, and what results.json says about the split."""

    index: int
    count: int
    plan: list[PlannedCase]
    header: dict


def parse(spec: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise HarnessError(f"option shard: {spec!r} is not K/N with 1 <= K <= N; give e.g. --shard 2/3 (part 2 of 3)")
    return int(match[1]), int(match[2])


def select(plan: list[PlannedCase], spec: str) -> Shard:
    """Part K of N of `plan`; its header names every case's part, so a merge can say what a missing part lacked."""
    index, count = parse(spec)
    part = assign(plan, count)
    ids = [planned.case.case_id for planned in plan]
    header = {"index": index, "count": count, "plan_digest": digest(ids), "plan": ids,
              "part": [part[unit(planned)] for planned in plan]}
    return Shard(index, count, [planned for planned in plan if part[unit(planned)] == index], header)


def digest(case_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(case_ids).encode()).hexdigest()[:16]


def unit(planned: PlannedCase) -> tuple[str, int]:
    return planned.case.model, planned.case.world_size


def cost(planned: PlannedCase) -> float:
    """Predicted seconds: nothing for a case decided at plan time; the kind's cost, growing with the ranks that
    share the machine (on two CPU cores a 4-rank case takes about 2.5 times a 1-rank one)."""
    if not planned.runs:
        return 0.0
    return kind_of(planned.case.kind).cost_s * (1 + planned.case.world_size) / 2


def assign(plan: list[PlannedCase], count: int) -> dict[tuple[str, int], int]:
    """Unit -> part (1..count): the costliest unit first, each to the part that ends cheapest with it (a part's
    first unit of a world size also pays that launch's start-up); ties to the lower part, so it is deterministic."""
    costs: dict[tuple[str, int], float] = {}
    for planned in plan:
        costs[unit(planned)] = costs.get(unit(planned), 0.0) + cost(planned)
    loads, sizes, part = [0.0] * count, [set() for _ in range(count)], {}
    for key in sorted(costs, key=lambda key: (-costs[key], key)):
        def total(i: int, key=key) -> float:
            startup = STARTUP_S if costs[key] and key[1] not in sizes[i] else 0.0
            return loads[i] + costs[key] + startup

        best = min(range(count), key=lambda i: (total(i), i))
        loads[best] = total(best)
        if costs[key]:
            sizes[best].add(key[1])
        part[key] = best + 1
    return part
