"""What every rank decided at each step of a flow's denoising loop (harness.flows.denoising), judged: a cache that
decides on what one rank sees takes another decision on another rank, and the ranks then compute different blocks
(different numbers, or collectives that no longer pair up); and a cache that reused nothing tested nothing."""

from __future__ import annotations

from harness.core.evidence import Evidence
from harness.core.figures import table


def failures(result, steps: list[list[int] | None] | None, labels: list[str] | None = None) -> list[Evidence]:
    """The loop's record as a block (each rank's `nn.Linear` calls per branch of each step, `labels` naming them:
    "step 0 cond", "step 0 uncond", ...), one `cache_decisions` item for each at which the ranks computed differently,
    and `cache_reuse` where no rank computed less at any than at its fullest (the cache never reused)."""
    if steps is None:
        return []
    if any(each is None or len(each) != len(steps[0]) for each in steps):
        counted = "; ".join(f"rank {rank}: {len(each or ())}" for rank, each in enumerate(steps))
        return [Evidence("cache_decisions", f"the ranks recorded different numbers of denoising steps ({counted})")]
    per_step = list(zip(*steps, strict=True))
    names = labels if labels is not None and len(labels) == len(per_step) else \
        [f"step {index}" for index in range(len(per_step))]
    rows = [[name, *calls] for name, calls in zip(names, per_step, strict=True)]
    columns = ["", *(f"rank {rank}" for rank in range(len(steps)))]
    result.extra.setdefault("blocks", []).append(table("What each rank computed per step (nn.Linear calls)",
                                                       columns, rows))
    found = [Evidence("cache_decisions", f"{name}: the ranks decided differently (nn.Linear calls per rank: "
                                         f"{', '.join(map(str, calls))})", name)
             for name, calls in zip(names, per_step, strict=True) if len(set(calls)) > 1]
    if not any(min(calls) < max(calls) for calls in steps if calls):
        found.append(Evidence("cache_reuse", f"no rank computed less at any of the {len(steps[0])} model calls than "
                                             f"at its first: the cache reused nothing, so the case compares nothing "
                                             f"it does"))
    return found
