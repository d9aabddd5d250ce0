"""Repeat determinism judged (harness.engine.repeat): a case run twice in one launch must end bit for bit alike on
every rank; a figure of its own (`repeat_max_abs`, in matrix.csv and on the page) and a check that fails a layout
whose ranks do not repeat themselves, naming the rank and the first module that differed. A backend known not to
be deterministic is declared here, with why and the band it is held to, never excused in silence."""

from __future__ import annotations

from harness.core.evidence import Evidence
from harness.core.figures import REPEAT, FigureSpec
from harness.core.results import CaseResult

REPEATED = FigureSpec("repeat_max_abs", "second run in the same launch: max abs diff to the first (0: bit for bit)",
                      ".2g", role=REPEAT, short="repeat")
# backend -> (why its runs differ, the largest difference allowed): CUDA kernels that accumulate with atomics
NONDETERMINISTIC = {
    "_native_efficient": ("PyTorch's memory-efficient SDPA backward accumulates with atomic adds (torch's "
                          "use_deterministic_algorithms lists it)", 1e-5),
    "flash": ("FlashAttention-2's backward accumulates dQ with atomic adds unless deterministic=True", 1e-5),
    "_flash_3": ("FlashAttention-3's backward accumulates dQ with atomic adds unless deterministic=True", 1e-5),
}


def judge(result: CaseResult, metrics: dict, backend: str) -> list[Evidence]:
    """The figure, and the failed check where the second run differs beyond its limit (0, or the declared band)."""
    found = (metrics or {}).get("repeat")
    if not found:
        return []
    result.extra["repeat"] = found
    value = found.get("max_abs")
    declared = NONDETERMINISTIC.get(backend)
    limit, derived = (declared[1], f"declared non-deterministic: {declared[0]}") if declared else \
        (0.0, "bit for bit: the same case run twice in one launch")
    if value is None:
        failed = "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(found["ranks"]) if isinstance(text, str))
        return [Evidence("repeat", f"cannot tell whether it repeats: {failed}")]
    result.figures.append(REPEATED.of(value, limit, derived))
    if value <= limit:
        return []
    ranks = [rank for rank, difference in enumerate(found["ranks"]) if difference > limit]
    where = f"; first at {found['module']}" if found.get("module") else ""
    return [Evidence("repeat", f"not repeatable: run twice in one launch, rank(s) {', '.join(map(str, ranks))} "
                               f"differ by {value:.3g} > {limit:g} ({derived}){where}", f"rank {ranks[0]}", value,
                     limit)]
