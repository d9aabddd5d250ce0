"""Evidence: each check of a case that failed, on what, by how much. A verdict is the list of them; a known issue
excuses items of it, never a case as a whole (harness.run.known_issues).

A kind's judge runs every one of its checks and returns an item for each that failed; the verdict adds the
integrity and proof checks. The status follows from the items (none: PASS; one that says the case could not be
judged: ERROR; else FAIL), and the reason is their text, grouped by check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Checks whose failure means the case has no verdict (the run itself failed, or what judging needs is missing).
ERROR_CHECKS = ("error", "cannot_judge")
PROOF = "proof."  # the prefix of the checks of what ran (backend, kernel, function, communication): never excused


@dataclass(frozen=True)
class Evidence:
    """One failed check: its name, what it is about (a parameter, a module, a rank; "" for the case as a whole),
    the figure and the limit it broke, and the sentence that says so."""

    check: str
    text: str
    subject: str = ""
    value: float | None = None
    limit: float | None = None

    @property
    def is_error(self) -> bool:
        return self.check in ERROR_CHECKS

    @property
    def is_proof(self) -> bool:
        return self.check.startswith(PROOF)

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value not in (None, "")}

    @classmethod
    def from_dict(cls, data: dict) -> Evidence:
        return cls(data["check"], data["text"], data.get("subject", ""), data.get("value"), data.get("limit"))


def per_subject(check: str, values: dict[str, float], limits: dict[str, float] | float, what: str,
                compare: str = ">") -> list[Evidence]:
    """One item per subject whose value breaks its limit (`values` and `limits` by subject, or one limit for all),
    worst first; `what` says the figure ('gradient rel L2 err of {subject}'). NaN always breaks."""
    found = []
    for subject, value in values.items():
        limit = limits if isinstance(limits, (int, float)) else limits[subject]
        if not value <= limit:
            found.append(Evidence(check, f"{what.format(subject=subject)} {value:.3g} {compare} {limit:.3g}", subject,
                                  value, limit))
    return sorted(found, key=lambda item: -_order(item.value))


def _order(value: float | None) -> float:
    return float("inf") if value is None or value != value else value


def reason(items: list[Evidence], shown: int = 3) -> str:
    """The items in words, grouped by check in the order the checks first appear. A check that failed on at most
    `shown` subjects says each whole; one that failed on more says its first (worst) item whole, then `shown - 1`
    more subjects with their figures, and counts the rest."""
    groups: dict[str, list[Evidence]] = {}
    for item in items:
        groups.setdefault(item.check, []).append(item)
    clauses = []
    for group in groups.values():
        if len(group) <= shown:
            clauses += [item.text for item in group]
            continue
        named = ", ".join(f"{item.subject} ({item.value:.3g})" if item.value is not None else item.subject
                          for item in group[1:shown])
        clauses.append(f"{group[0].text}; also {named} and {len(group) - shown} more")
    return "; ".join(clauses)


def status_of(items: list[Evidence]):
    """PASS without items, ERROR when one says the case could not be judged, else FAIL."""
    from harness.core.results import Status

    if not items:
        return Status.PASS
    return Status.ERROR if any(item.is_error for item in items) else Status.FAIL
