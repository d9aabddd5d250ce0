"""Reading results.json for the report: the header and every case as the typed records they were written from
(`RunHeader`, `CaseResult`), whatever the file left out, so that a view asks a record for a field by its name and a
field that moves fails where it is read.

The fields and their defaults are `CaseResult`'s own (read off the dataclass, not restated), the status order is
`Status`'s, and a traceback stored once in the file's table is resolved back to text for each case that has it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness.core.errors import HarnessError
from harness.core.header import RunHeader
from harness.core.results import CaseResult, Status, cases_of

STATUSES = tuple(status.value for status in Status)
BAD = frozenset(status.value for status in Status if status.is_bad)
ATTENTION = tuple(status.value for status in Status if status.needs_a_look)  # listed one by one, in this order
OBSERVED = "; observed "  # harness.run.verdict writes an XFAIL's reason as "<known issue or refusal>; observed <error>"
ANCHOR = "case-"  # index.html#case-<case id> opens that case
# The fields people read as text: never None on the page (from CaseResult's annotations).
TEXT = tuple(f.name for f in fields(CaseResult) if f.type in ("str", "str | None", "Status"))
_CONTAINERS = {f.name: f.default_factory for f in fields(CaseResult) if f.default_factory is not MISSING}
_TEXT_DEFAULTS = {f.name: str(f.default) if isinstance(f.default, str) else "" for f in fields(CaseResult)
                  if f.name in TEXT}


def load(report_dir: Path) -> tuple[RunHeader, list[CaseResult]]:
    """The header and the cases of `report_dir/results.json`, as records.

    A missing, unreadable or foreign file is a HarnessError that names it and says what to do."""
    path = Path(report_dir) / "results.json"
    fix = "point at a folder that `harness run` wrote (its --report-dir), or re-run `harness run` to rewrite it"
    if not path.is_file():
        raise HarnessError(f"no results at {path}; run `harness run` first or pass the folder it wrote "
                           "(its --report-dir)")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: invalid JSON or not UTF-8
        raise HarnessError(f"{path} cannot be read as JSON ({error}); {fix}") from error
    if not _is_results(payload):
        raise HarnessError(f"{path} is not a harness results file (expected an object with a \"cases\" list of "
                           f"objects); {fix}")
    try:
        cases = cases_of(payload)
    except ValueError as error:  # a traceback index without its table
        raise HarnessError(f"{path} is not whole ({error}); {fix}") from error
    return RunHeader.from_dict(payload.get("header") or {}), [record(case) for case in cases]


def _is_results(payload: Any) -> bool:
    """The shape results.write_results gives: {"header": {...}, "tracebacks": [...], "cases": [{...}, ...]}."""
    if not isinstance(payload, dict) or not isinstance(payload.get("header") or {}, dict):
        return False
    cases = payload.get("cases")
    return isinstance(cases, list) and all(isinstance(case, dict) for case in cases)


def record(case: dict[str, Any]) -> CaseResult:
    """A case of the file as its record: a field the file left out (an older or a hand-written file) takes its
    default, text is never None, and a status this harness does not know reads as ERROR that says so (a page that
    refused the file would show nothing at all)."""
    given = dict(case)
    for name, default in _TEXT_DEFAULTS.items():
        given[name] = default if given.get(name) is None else str(given[name])
    for name, factory in _CONTAINERS.items():
        empty = factory()
        given[name] = given[name] if isinstance(given.get(name), type(empty)) else empty
    given["shape"] = given["shape"] or "default"
    given["world_size"] = given.get("world_size") or 1
    status = given["status"].upper()
    if status not in STATUSES:
        given["reason"] = (f"results.json gives the status {status or '(none)'!r}, which this report does not know"
                           + (f"; {given['reason']}" if given["reason"] else ""))
        status = Status.ERROR.value
    given["status"] = status
    return CaseResult.from_dict(given)


def anchor(case_id: str) -> str:
    """The page fragment that opens a case: `case-` and the id as it is (`#case-flux/ring2/native/fp32/train`)."""
    return ANCHOR + case_id


def link(page: str, case_id: str) -> str:
    """A URL of `page` that opens the case, percent-encoding only what a fragment cannot hold."""
    return f"{page}#{quote(anchor(case_id), safe='/@+-_.~:=')}"


def base_slug(case_id: str) -> str:
    """The slug anchors earlier pages used (`case-flux-ring2-native-fp32-train`); the page still opens them."""
    return ANCHOR + (re.sub(r"[^A-Za-z0-9_.-]+", "-", case_id).strip("-") or "unnamed")


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
