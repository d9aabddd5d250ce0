"""Known failures, listed with their reason and link, that turn a FAIL or ERROR into XFAIL.

The file is TOML: one `[[issue]]` table per entry, `match` is a glob (or a list) over case ids. diffusers rewords
its errors between releases and fixes or introduces bugs, so `error_contains` may list alternative texts (any one
matches) and `diffusers` may give the releases the entry applies to (a PEP 440 range such as ">=0.37,<0.40").
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from harness.core.errors import HarnessError

_KEYS = {"match", "reason", "link", "error_contains", "diffusers", "status", "max_abs_err"}


@dataclass(frozen=True)
class KnownIssue:
    match: str | tuple[str, ...]
    reason: str
    link: str = ""
    error_contains: str | tuple[str, ...] = ""
    diffusers: str = ""  # a version range, e.g. ">=0.40"; empty: every release
    status: str = ""  # the status the failure must have (FAIL or ERROR); empty: either
    max_abs_err: tuple[float, float] | None = None  # a numerical failure: the measured band it must fall in

    def applies(self, case_id: str, message: str | None = None, version: str | None = None, status: str | None = None,
                max_abs_err: float | None = None) -> bool:
        """Matches the case id (one glob or a list), the installed diffusers (`version`, read from the package when
        not given) if the entry names a range, and, for a failure (`message` given): one of the expected texts, the
        expected status, and for a numerical entry a max abs error inside its band (a bigger or smaller error is
        another bug, and stays visible)."""
        patterns = (self.match,) if isinstance(self.match, str) else self.match
        if not any(fnmatch.fnmatchcase(case_id, pattern) for pattern in patterns):
            return False
        if self.diffusers and not self.covers(version):
            return False
        if message is None:  # a case that passed: does the entry name it (XPASS)?
            return True
        texts = (self.error_contains,) if isinstance(self.error_contains, str) else self.error_contains
        if not any(text in message for text in texts if text):
            return False
        if self.status and status is not None and status != self.status:
            return False
        if self.max_abs_err is not None:
            low, high = self.max_abs_err
            return max_abs_err is not None and low <= max_abs_err <= high
        return True

    def covers(self, version: str | None = None) -> bool:
        """Whether the entry applies to diffusers `version` (default: the installed one)."""
        if not self.diffusers:
            return True
        if version is None:
            from harness.core.compat import installed_version

            version = installed_version()
        return SpecifierSet(self.diffusers).contains(Version(version), prereleases=True)

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
    return [_issue(path, index, entry) for index, entry in enumerate(data.get("issue", []))]


def _issue(path: Path, index: int, entry: dict) -> KnownIssue:
    where = f"{path}: [[issue]] #{index + 1}" + (f" ({entry['match']!r})" if "match" in entry else "")
    if "match" not in entry or "reason" not in entry:
        raise HarnessError(f"{where} needs both 'match' and 'reason'")
    unknown = set(entry) - _KEYS
    if unknown:
        raise HarnessError(f"{where} has unknown keys {sorted(unknown)}; valid keys: {', '.join(sorted(_KEYS))}")
    fields = dict(entry)
    for key in ("match", "error_contains"):
        value = fields.get(key, "")
        if isinstance(value, list):
            if not value or not all(isinstance(item, str) and item for item in value):
                raise HarnessError(f"{where}: '{key}' must be a string or a non-empty list of non-empty strings")
            fields[key] = tuple(value)
        elif not isinstance(value, str):
            raise HarnessError(f"{where}: '{key}' must be a string or a list of strings, not {type(value).__name__}")
    for key in ("reason", "link", "diffusers", "status"):
        if not isinstance(fields.get(key, ""), str):
            raise HarnessError(f"{where}: '{key}' must be a string")
    if not fields.get("error_contains"):
        raise HarnessError(f"{where} needs 'error_contains': the text of the failure it expects, so that another "
                           "failure of the same cases stays visible")
    if fields.get("status", "") not in ("", "FAIL", "ERROR"):
        raise HarnessError(f"{where}: 'status' must be FAIL or ERROR")
    if "max_abs_err" in fields:
        band = fields["max_abs_err"]
        if not (isinstance(band, list) and len(band) == 2 and all(isinstance(v, int | float) for v in band)
                and band[0] <= band[1]):
            raise HarnessError(f"{where}: 'max_abs_err' must be the measured band [low, high], e.g. [0.2, 0.4]")
        if fields.get("status") != "FAIL":
            raise HarnessError(f"{where}: a 'max_abs_err' band is for a numerical failure: add status = \"FAIL\"")
        fields["max_abs_err"] = (float(band[0]), float(band[1]))
    if fields.get("diffusers"):
        try:
            SpecifierSet(fields["diffusers"])
        except InvalidSpecifier:
            raise HarnessError(f"{where}: 'diffusers' = {fields['diffusers']!r} is not a version range; write e.g. "
                               f"\">=0.37,<0.40\"") from None
    return KnownIssue(**fields)


def find(issues: list[KnownIssue], case_id: str, message: str | None = None, version: str | None = None,
         status: str | None = None, max_abs_err: float | None = None) -> KnownIssue | None:
    return next((issue for issue in issues if issue.applies(case_id, message, version, status, max_abs_err)), None)

