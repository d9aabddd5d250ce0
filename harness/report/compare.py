"""Two runs side by side, as a CI gate: which cases in both runs changed status, which exist in only one, and
whether anything newly fails, as Markdown for a terminal, a job summary or a PR comment; compare_page.py writes
compare.html from it (and imports this module; this one imports no page).

A regression is a case that fails (FAIL, ERROR, TIMEOUT) in NEW and did not in OLD: one in both runs that went from
PASS, XFAIL or SKIP to a failing status, or one only in NEW that fails (a newly planned case that fails is as much
news as an old one that broke). A case failing in both runs is no regression; `harness run` already fails on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.results import CaseResult
from harness.report.data import BAD
from harness.report.idsets import describe

WARN = "\u26a0"


@dataclass
class Comparison:
    """`changed`: in both runs with another status ({case_id, old, new, old_reason, new_reason}, regressions
    first); `only_old` / `only_new`: in one run ({case_id, status, reason}), in that run's order."""

    changed: list[dict[str, Any]] = field(default_factory=list)
    only_old: list[dict[str, Any]] = field(default_factory=list)
    only_new: list[dict[str, Any]] = field(default_factory=list)
    page: Path | None = None  # where compare_page.compare_runs wrote compare.html
    wrote: list[Path] = field(default_factory=list)  # every file compare_runs wrote, the page last

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return [change for change in self.changed if is_regression(change)]

    @property
    def new_failing(self) -> list[dict[str, Any]]:
        return [case for case in self.only_new if case["status"] in BAD]

    @property
    def exit_code(self) -> int:
        """1 when anything newly fails (so `harness report --compare` can gate CI), else 0."""
        return 1 if self.regressions or self.new_failing else 0

    def summary(self) -> str:
        """One line: `3 changed status (2 regressions), 12 only in NEW (1 failing), 0 only in OLD`."""
        failing = f" ({len(self.new_failing)} failing)" if self.new_failing else ""
        return (f"{len(self.changed)} changed status ({len(self.regressions)} regression"
                f"{'' if len(self.regressions) == 1 else 's'}), {len(self.only_new)} only in NEW{failing}, "
                f"{len(self.only_old)} only in OLD")


def status_changes(old_cases: list[CaseResult], new_cases: list[CaseResult]) -> Comparison:
    """Split the two runs' cases into changed status (in both), only in OLD and only in NEW."""
    old = {c.case_id: c for c in old_cases}
    new = {c.case_id: c for c in new_cases}
    comparison = Comparison()
    for case_id, after in new.items():
        before = old.get(case_id)
        if before is None:
            comparison.only_new.append(_one(after))
        elif before.status is not after.status:
            comparison.changed.append({"case_id": case_id, "old": before.status.value, "new": after.status.value,
                                       "old_reason": before.reason, "new_reason": after.reason})
    comparison.only_old = [_one(case) for case_id, case in old.items() if case_id not in new]
    comparison.changed.sort(key=lambda change: 0 if is_regression(change) else 1)
    return comparison


def _one(case: CaseResult) -> dict[str, Any]:
    return {"case_id": case.case_id, "status": case.status.value, "reason": case.reason}


def is_regression(change: dict[str, Any]) -> bool:
    """A case in both runs that fails now and did not before."""
    return change["new"] in BAD and change["old"] not in BAD


def status_tally(cases: list[dict[str, Any]]) -> str:
    """`11 PASS, 1 FAIL`: the statuses of a set of rows with a "status" (this module's one-sided cases, `harness
    ab`'s), most common first."""
    tally: dict[str, int] = {}
    for case in cases:
        tally[case["status"]] = tally.get(case["status"], 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(tally.items(), key=lambda item: -item[1]))


def changed_markdown(comparison: Comparison) -> str:
    """The summary line, the changed cases (one row each), the failing cases only in NEW (one row each), and the
    cases in one run only as counts and exact brace patterns; compare.html lists every one of them."""
    lines = [f"**compare: {comparison.summary()}**", ""]
    if comparison.changed:
        lines += [f"Changed status ({len(comparison.changed)}):", "", "| case | old | new | reason |",
                  "|---|---|---|---|"]
        for change in comparison.changed:
            reason = change["new_reason"] or change["old_reason"]
            marker = f" {WARN}" if is_regression(change) else ""
            lines.append(f"| `{change['case_id']}` | {change['old']} | {change['new']}{marker} | {_one_line(reason)} |")
    else:
        lines.append("No case in both runs changed status.")
    if comparison.new_failing:
        lines += ["", f"Failing, only in NEW ({len(comparison.new_failing)}):", "", "| case | status | reason |",
                  "|---|---|---|"]
        lines += [f"| `{c['case_id']}` | {c['status']} {WARN} | {_one_line(c['reason'])} |"
                  for c in comparison.new_failing]
    for name, cases in (("NEW", comparison.only_new), ("OLD", comparison.only_old)):
        if cases:
            lines += ["", f"Only in {name}: {len(cases)} ({status_tally(cases)}): "
                      + describe((c["case_id"] for c in cases), 600).replace("|", "\\|")]
    return "\n".join(lines) + "\n"


def _one_line(text: str, limit: int = 140) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
