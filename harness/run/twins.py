"""A compiled case's eager twin: the same case run as written. A compiled case that fails names its twin's status
and key figure beside its own, so one line tells whether compiling changed the numbers (the twin passes) or the
layout did (the twin fails too)."""

from __future__ import annotations

from harness.core.modes import EAGER, eager_id
from harness.core.results import CaseResult, Status


def name_eager_twins(results: list[CaseResult]) -> None:
    """Append the eager twin's figures to each failing compiled case's reason (and keep them in `extra`). A twin
    that is not among `results` (not planned, or another shard's) is said to be absent, not guessed. Named again
    (`harness merge` of shards, where the twin may have been another part's), a case's earlier words are replaced."""
    by_id = {result.case_id: result for result in results}
    for result in results:
        if result.mode == EAGER or result.status is not Status.FAIL:
            continue
        said = result.extra.get("eager_twin", {}).get("said", "")
        if said and result.reason.endswith(said):
            result.reason = result.reason[:-len(said)]
        twin_id = eager_id(result.case_id)[0]
        twin = by_id.get(twin_id)
        if twin is None:
            found, said = {"status": "not in this run"}, f"; eager twin {twin_id}: not in this run"
        else:
            found = {"status": twin.status.value, "figures": twin.figures}
            said = (f"; eager twin: {twin.status.value}{' ' + twin.cell if twin.cell else ''} (compiled: "
                    f"{result.status.value}{' ' + result.cell if result.cell else ''})")
        result.extra["eager_twin"] = {"case_id": twin_id, **found, "said": said}
        result.reason += said
