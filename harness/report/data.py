"""Reading results.json for the report: every case with every field of a result, whatever the file left out.

The fields and their defaults are `CaseResult`'s own (read off the dataclass, not restated), the status order is
`Status`'s, and a traceback stored once in the file's table is resolved back to text for each case that has it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness.core.errors import HarnessError
from harness.core.results import CaseResult, Status, cases_of

STATUSES = tuple(status.value for status in Status)
BAD = frozenset(status.value for status in Status if status.is_bad)
ATTENTION = tuple(status.value for status in Status if status.needs_a_look)  # listed one by one, in this order
OBSERVED = "; observed "  # harness.run.verdict writes an XFAIL's reason as "<known issue or refusal>; observed <error>"
ANCHOR = "case-"  # index.html#case-<case id> opens that case
# The fields people read as text: never None on the page (from CaseResult's annotations).
TEXT = tuple(f.name for f in fields(CaseResult) if f.type in ("str", "str | None", "Status"))


def load(report_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the cases of `report_dir/results.json`, each case with every field of a result.

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
    return payload.get("header") or {}, [normalise(case) for case in cases]


def _is_results(payload: Any) -> bool:
    """The shape results.write_results gives: {"header": {...}, "tracebacks": [...], "cases": [{...}, ...]}."""
    if not isinstance(payload, dict) or not isinstance(payload.get("header") or {}, dict):
        return False
    cases = payload.get("cases")
    return isinstance(cases, list) and all(isinstance(case, dict) for case in cases)


def normalise(case: dict[str, Any]) -> dict[str, Any]:
    """Every field of a result, with its default where the file has none; text never None; an unknown status is
    shown as it is, not dropped."""
    out = {}
    for f in fields(CaseResult):
        value = case.get(f.name)
        if value is None and f.default_factory is not MISSING:
            value = f.default_factory()
        elif value is None and f.default is not MISSING:
            value = f.default
        out[f.name] = "" if value is None and f.name in TEXT else value
    for name in TEXT:
        out[name] = str(out[name].value if isinstance(out[name], Status) else out[name])
    out["shape"] = out["shape"] or "default"
    out["status"] = out["status"].upper() or Status.ERROR.value
    for name, kind in (("extra", dict), ("figures", list), ("evidence", list)):
        out[name] = kind(out[name]) if isinstance(out[name], kind) else kind()
    return out


def anchor(case_id: str) -> str:
    """The page fragment that opens a case: `case-` and the id as it is (`#case-flux/ring2/native/fp32/train`)."""
    return ANCHOR + case_id


def link(page: str, case_id: str) -> str:
    """A URL of `page` that opens the case, percent-encoding only what a fragment cannot hold."""
    return f"{page}#{quote(anchor(case_id), safe='/@+-_.~:=')}"


def base_slug(case_id: str) -> str:
    """The slug anchors earlier pages used (`case-flux-ring2-native-fp32-train`); the page still opens them."""
    return ANCHOR + (re.sub(r"[^A-Za-z0-9_.-]+", "-", case_id).strip("-") or "unnamed")


def unique(values) -> list[str]:
    """Distinct values in order of first appearance, which is the plan's order."""
    return list(dict.fromkeys(values))


def ordered_statuses(values) -> list[str]:
    """Statuses in `Status` order, then any status this harness does not know."""
    present = set(values)
    return [s for s in STATUSES if s in present] + [v for v in unique(values) if v not in STATUSES]


def status_counts(cases: list[dict[str, Any]]) -> dict[str, int]:
    """Counts from the cases themselves (the truth on this page), known statuses first then any other."""
    counts = {status: 0 for status in STATUSES}
    for case in cases:
        counts[case["status"]] = counts.get(case["status"], 0) + 1
    return counts


def issue_of(case: dict[str, Any]) -> str:
    """The known issue (or expected refusal) an XFAIL matched, without the observed error that differs per case."""
    return case["reason"].split(OBSERVED, 1)[0]


def plain(value: Any, spec: str = ".2f") -> str:
    """Fixed-point for quantities people read as amounts (seconds, megabytes)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return "\u2014"
    try:
        x = float(value)
    except ValueError:
        return "\u2014"
    return format(x, spec) if math.isfinite(x) else str(x)
