"""Known failures, listed with their reason and link, that turn a FAIL or ERROR into XFAIL.

The file is TOML: one `[[issue]]` table per entry, `match` is a glob over case ids.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError


@dataclass(frozen=True)
class KnownIssue:
    match: str | tuple[str, ...]
    reason: str
    link: str = ""
    error_contains: str = ""

    def applies(self, case_id: str, message: str | None = None) -> bool:
        """Matches the case id (one glob or a list) and, for a failure (`message` given), the expected error text."""
        patterns = (self.match,) if isinstance(self.match, str) else self.match
        if not any(fnmatch.fnmatchcase(case_id, pattern) for pattern in patterns):
            return False
        return message is None or not self.error_contains or self.error_contains in message

    def describe(self) -> str:
        return f"known issue: {self.reason}" + (f" ({self.link})" if self.link else "")


def load_known_issues(path: Path) -> list[KnownIssue]:
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise HarnessError(f"{path}: invalid TOML ({error})") from None
    issues = []
    for index, entry in enumerate(data.get("issue", [])):
        if "match" not in entry or "reason" not in entry:
            raise HarnessError(f"{path}: [[issue]] #{index + 1} needs both 'match' and 'reason'")
        unknown = set(entry) - {"match", "reason", "link", "error_contains"}
        if unknown:
            raise HarnessError(f"{path}: [[issue]] #{index + 1} has unknown keys {sorted(unknown)}")
        if isinstance(entry["match"], list):
            entry["match"] = tuple(entry["match"])
        issues.append(KnownIssue(**entry))
    return issues


def find(issues: list[KnownIssue], case_id: str, message: str | None = None) -> KnownIssue | None:
    return next((issue for issue in issues if issue.applies(case_id, message)), None)
