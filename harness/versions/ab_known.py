"""What `harness ab` calls a regression beyond `report --compare`'s (a case that newly fails): a case that passed on
the base and is XFAIL (or REFUSED) on the head. The head's known-issue list (or a refusal it expects) excuses there
the very change ab exists to catch, so it counts all the same, named with what excuses it, unless `--accept-known`
accepts it: then it is still listed, as accepted, and the exit code does not count it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.core.results import CaseResult, Status
from harness.report.compare import Comparison

PASSED = (Status.PASS.value, Status.XPASS.value)  # XPASS: a listed case that passed all the same
EXCUSED = (Status.XFAIL.value, Status.REFUSED.value)  # a known bug, or a refusal the head expects


@dataclass
class AbComparison(Comparison):
    """The status changes with the known regressions (`known`: changes as report.compare gives them, each with
    the `excuse` the head gives), counted among the regressions unless `accepted`."""

    known: list[dict[str, Any]] = field(default_factory=list)
    accepted: bool = False

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return super().regressions + ([] if self.accepted else self.known)

    def summary(self) -> str:
        count = len(self.known) if self.accepted else 0
        return super().summary() + (f", {count} known regression{'' if count == 1 else 's'} accepted" if count
                                    else "")

    @property
    def why_exit_1(self) -> str:
        """Why the exit code is 1, in a few words ("" when it is 0)."""
        reasons = ["a case newly fails"] if super().regressions or self.new_failing else []
        if self.known and not self.accepted:
            reasons.append("a case that passed on the base is a known issue on the head (--accept-known accepts it)")
        return "; ".join(reasons)

    def lines(self) -> list[str]:
        """One line per known regression: the case, the change, and what excuses it on the head."""
        verdict = "accepted (--accept-known)" if self.accepted else "regression"
        return [f"  {verdict}: {change['case_id']} {change['old']} -> {change['new']}, on the head {change['excuse']}"
                for change in self.known]


def with_known(comparison: Comparison, head: list[CaseResult], accepted: bool) -> AbComparison:
    """`comparison` with its changes from a passing base case to an XFAIL or REFUSED head case as known
    regressions."""
    by_id = {case.case_id: case for case in head}
    known = [{**change, "excuse": excuse(by_id[change["case_id"]])} for change in comparison.changed
             if change["old"] in PASSED and change["new"] in EXCUSED]
    return AbComparison(**vars(comparison), known=known, accepted=accepted)


def excuse(case: CaseResult) -> str:
    """What makes the case XFAIL: each known-issue entry by its title and where it is (`known_issues.toml #3`), or
    the reason the head gives (an expected refusal)."""
    if not case.known_issues:
        return case.reason.split("; observed ")[0]
    return "; ".join(f"known issue \"{entry['title']}\" [{entry['key']}]"
                     + (f" ({entry['link']})" if entry.get("link") else "") for entry in case.known_issues)
