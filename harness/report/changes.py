"""What changed against a base run, case by case, as the page marks it (Allure's history): a case that fails now and
did not there (a new failure), one that failed there and does not now (fixed), another change of status, the same
status with a deciding check that moved by a tenth of its allowance or more (a changed figure), and a case the base
did not have. The base is a run's report folder (`harness run --compare-with DIR`, `harness report --compare OLD
NEW`, `harness ab`'s base)."""

from __future__ import annotations

import math
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.results import RESULTS_FILE, CaseResult, read_results

# The kinds of change, in the order the page lists them (each with the words it is shown by)
KINDS = {"new failure": "fails now, not in the base run", "fixed": "failed in the base run, not now",
         "status": "another status than in the base run", "figure": "its deciding check moved by 0.1x of its "
         "allowance or more", "new case": "not in the base run"}
MOVED = 0.1  # how far a deciding check's share of its allowance must move to be a changed figure


def load_base(base: Path | str) -> list[CaseResult]:
    """The base run's cases, from its report folder (or its results.json), read by the one reader."""
    path = Path(base)
    path = path / RESULTS_FILE if path.is_dir() else path
    return read_results(path, f"--compare-with names a run's report folder (its --report-dir); {path} has none")[1]


def changes(base: list[CaseResult], cases: list[CaseResult]) -> dict[int, list[str]]:
    """{index of a case: [kind, its status in the base, its cell there]} for each case that changed (KINDS)."""
    before = {case.case_id: case for case in base}
    found = {}
    for index, case in enumerate(cases):
        was = before.get(case.case_id)
        kind = _kind(was, case)
        if kind:
            found[index] = [kind, was.status.value if was else "", was.cell if was else ""]
    return found


def _kind(was: CaseResult | None, now: CaseResult) -> str:
    if was is None:
        return "new case"
    if now.status.is_bad and not was.status.is_bad:
        return "new failure"
    if was.status.is_bad and not now.status.is_bad:
        return "fixed"
    if was.status is not now.status:
        return "status"
    return "figure" if _moved(was.deciding, now.deciding) else ""


def _moved(was: dict | None, now: dict | None) -> bool:
    """Whether the deciding check changed, or its share of its allowance moved by MOVED or more."""
    if not was or not now:
        return False
    if (was.get("name"), was.get("subject")) != (now.get("name"), now.get("subject")):
        return True
    before, after = float(was.get("margin", 0)), float(now.get("margin", 0))
    if math.isinf(before) or math.isinf(after):
        return before != after
    return abs(after - before) >= MOVED


def base_or_none(base: Path | str | None) -> tuple[list[CaseResult] | None, str]:
    """The base's cases and "" (none asked: None), or None and why it cannot be read (the page says so)."""
    if not base:
        return None, ""
    try:
        return load_base(base), ""
    except HarnessError as error:
        return None, str(error)
