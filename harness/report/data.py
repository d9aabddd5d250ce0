"""What the views share about the cases they render (read by `harness.core.results.read_results`): the status
order (`Status`'s), which statuses are bad, the anchors that open a case, and small formatting helpers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from harness.core.results import REFUSAL, SEVERITIES, CaseResult, Status

STATUSES = tuple(status.value for status in Status)
BAD = frozenset(status.value for status in Status if status.is_bad)
ATTENTION = tuple(status.value for status in Status if status.needs_a_look)  # listed one by one, in this order
OBSERVED = "; observed "  # harness.run.verdict writes an XFAIL's reason as "<known issue or refusal>; observed <error>"
ANCHOR = "case-"  # index.html#case-<case id> opens that case


def anchor(case_id: str) -> str:
    """The page fragment that opens a case: `case-` and the id as it is (`#case-flux/ring2/native/fp32/train`)."""
    return ANCHOR + case_id


def link(page: str, case_id: str) -> str:
    """A URL of `page` that opens the case, percent-encoding only what a fragment cannot hold."""
    return f"{page}#{quote(anchor(case_id), safe='/@+-_.~:=')}"


def unique(values: Iterable[str]) -> list[str]:
    """Distinct values in order of first appearance, which is the plan's order."""
    return list(dict.fromkeys(values))


def ordered_statuses(values: Iterable[str]) -> list[str]:
    """The statuses among `values`, in `Status` order."""
    present = set(values)
    return [s for s in STATUSES if s in present]


def status_counts(cases: list[CaseResult]) -> dict[str, int]:
    """Counts from the cases themselves (the truth on this page), in `Status` order."""
    counts = {status: 0 for status in STATUSES}
    for case in cases:
        counts[case.status.value] += 1
    return counts


def standing(cases: list[CaseResult]) -> dict[str, int]:
    """What a run's verdict stands on: its failures (FAIL, ERROR, TIMEOUT: none is known), then the known issues it
    excused, by severity (SEVERITIES), the expected refusals among them."""
    found = {"failures": sum(case.status.is_bad for case in cases), **{severity: 0 for severity in SEVERITIES}}
    for case in cases:
        if case.severity:
            found[case.severity] += 1
    return found


# How the verdict's line names each count (`standing_text`), in SEVERITIES' order
_STANDING = {"silently wrong": "known silently wrong result{s} in diffusers", "crash": "known crash{es}",
             "hang": "known hang{s}", REFUSAL: "expected refusal{s} (diffusers refusing what it does not support)"}


def standing_text(counts: dict[str, int]) -> str:
    """`0 new failures; 20 known silently wrong results in diffusers, 140 known crashes, 46 expected refusals
    (...)`: the failures, then each kind of known issue the run met."""
    failures = counts["failures"]
    head = f"{failures} new failure{'' if failures == 1 else 's'}"
    known = [f"{counts[severity]} " + _STANDING[severity].format(s="" if counts[severity] == 1 else "s",
                                                                 es="" if counts[severity] == 1 else "es")
             for severity in SEVERITIES if counts[severity]]
    return head + (f"; {', '.join(known)}" if known else "; no known issue met")


def issue_of(case: CaseResult) -> str:
    """The known issue (or expected refusal) an XFAIL matched, without the observed error that differs per case."""
    return case.reason.split(OBSERVED, 1)[0]


def plain(value: Any, spec: str = ".2f") -> str:
    """Fixed-point for quantities people read as amounts (seconds, megabytes)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return "\u2014"
    try:
        x = float(value)
    except ValueError:
        return "\u2014"
    return format(x, spec) if math.isfinite(x) else str(x)
