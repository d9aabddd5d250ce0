"""Known failures, listed with their reason and link: each entry excuses the evidence it names, nothing more.

The file is TOML, one `[[issue]]` table per entry: its `title` (a few words a view names it by), its `reason` (the
traced cause in words), its `link` (where the cause is: the line of diffusers or torch, or the upstream issue) and,
where diffusers has one, its `upstream` (the issue or pull request that discusses it, linked from the report).
`severity` says what kind of finding it is, in the order a reviewer reads them: "silently wrong" (the default of a
FAIL entry: wrong numbers or parallelism silently absent), "crash" (the default of an ERROR entry: an internal error
where diffusers should run or refuse), "hang", or "refusal" (diffusers refusing, with its own message, what it does
not support: its correct behaviour, so a case every entry of which is a refusal is REFUSED, not XFAIL).
`match` is a glob (or a list) over case ids, and `diffusers` (a
PEP 440 range such as ">=0.37,<0.40") limits the entry to the releases that have the issue. A glob matches a case's
id with or without its mode (harness.core.modes): an issue of diffusers is the same compiled, and its evidence must
still lie in the bands measured eager; `modes` (a list) limits the entry to those modes. Likewise with or without its
load (harness.loads): a model's bug is the same whether `enable_parallelism` or `from_pretrained` applied the
layout; `loads` (a list) limits the entry to those loads (a loader's own bug). What it excuses:

- an **error** (`status = "ERROR"`): `error_contains`, one text or a list of alternatives (diffusers rewords its
  errors between releases), must appear in the error;
- a **hang** (`status = "TIMEOUT"`): `error_contains` must appear in the stacks the ranks were in when the case's
  time ran out (a file and line of diffusers), so a hang elsewhere stays TIMEOUT;
- a **wrong result** (`status = "FAIL"`): one table per check it excuses, `[issue.evidence.<check>]`, with the
  measured `band = [low, high]` the check's figure must lie in, the `subjects` (globs over the parameters, modules
  or ranks the check failed on; required for the checks that name one) and optionally a text it `contains`;
- a **failed proof** of what communicated (`[issue.evidence."proof.comms"]`, one failed check per missing exchange,
  its subject `<module>: <collective>`), only named exactly: its `subjects`, the counts seen (`band`, e.g. [0, 0])
  and the counts predicted (`limit`, e.g. [4, 4] all-to-alls of one Ulysses attention call). A proof without counts
  (a wrong backend, kernel or function ran) is never excused.

A case is XFAIL only when every failed check is excused; any other failed check keeps it FAIL (harness.run.verdict).
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from harness.core.errors import HarnessError
from harness.core.evidence import Evidence
from harness.core.modes import MODES, eager_id
from harness.core.results import REFUSAL, SEVERITIES
from harness.loads import LOADS, enable_id

_KEYS = {"match", "title", "reason", "link", "upstream", "error_contains", "diffusers", "status", "evidence", "modes",
         "loads", "severity"}

_EXCUSE_KEYS = {"subjects", "band", "contains", "limit"}
# The proof checks an entry may name, each a count seen against a count predicted (harness.run.verdict): excused only
# where the entry names them exactly, its subjects, the counts seen (`band`) and those predicted (`limit`)
DEFAULT_SEVERITY = {"FAIL": "silently wrong", "ERROR": "crash", "TIMEOUT": "hang"}  # an entry's, by its status
PROOFS = {"proof.comms": "modules and their collective (`transformer_blocks.*.attn: all_to_all`)"}


@dataclass(frozen=True)
class Excuse:
    """What one check may show and still be the known issue: its subjects (globs; empty: the case as a whole), the
    band its figure lies in, a text its sentence contains, and the band its limit lies in (a proof's predicted
    count)."""

    subjects: tuple[str, ...] = ()
    band: tuple[float, float] | None = None
    contains: str = ""
    limit: tuple[float, float] | None = None

    @property
    def names_a_proof(self) -> bool:
        """Whether it names a failed proof exactly: its subjects, the counts seen and the counts predicted."""
        return bool(self.subjects) and self.band is not None and self.limit is not None

    def covers(self, item: Evidence) -> bool:
        if self.subjects:
            if not any(fnmatch.fnmatchcase(item.subject, glob) for glob in self.subjects):
                return False
        elif item.subject:
            return False
        if self.band is not None:
            low, high = self.band
            if item.value is None or not low <= item.value <= high:
                return False
        if self.limit is not None:
            low, high = self.limit
            if item.limit is None or not low <= item.limit <= high:
                return False
        return self.contains in item.text


@dataclass(frozen=True, eq=False)  # one entry is itself, whatever another entry says
class KnownIssue:
    match: str | tuple[str, ...]
    reason: str
    link: str = ""  # where the traced cause is (a source line, an upstream issue or PR)
    error_contains: str | tuple[str, ...] = ""
    diffusers: str = ""  # a version range, e.g. ">=0.40"; empty: every release
    status: str = "ERROR"  # ERROR: excuses an error by its text; FAIL: the checks of `evidence`; TIMEOUT: a hang by its
    # ranks' stacks
    evidence: dict[str, Excuse] = field(default_factory=dict)
    modes: tuple[str, ...] = ()  # the modes it is about (harness.core.modes); empty: every mode
    loads: tuple[str, ...] = ()  # the loads it is about (harness.loads); empty: every load
    key: str = ""  # where the entry is ("known_issues.toml #3"), to name it in results and warnings
    title: str = ""  # a few words that name it; empty: the first clause of its reason
    upstream: str = ""  # the upstream issue or pull request about it, where there is one
    severity: str = ""  # one of SEVERITIES; "": its status's default (`finding`)

    def applies(self, case_id: str, version: str | None = None) -> bool:
        """Whether the entry is about this case: its id (one glob or a list) and, if it names a range, the installed
        diffusers (`version`, read from the package when not given)."""
        patterns = (self.match,) if isinstance(self.match, str) else self.match
        plain, mode = eager_id(case_id)
        enabled, load = enable_id(case_id)
        if self.modes and mode not in self.modes or self.loads and load not in self.loads:
            return False
        names = {case_id, plain, enabled, enable_id(plain)[0]}
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns for name in names):
            return False
        return self.covers(version)

    def excuses(self, item: Evidence) -> bool:
        """Whether one failed check of a case the entry applies to is this known issue. A proof failure only where
        the entry names it exactly (PROOFS: its subjects, the counts seen and predicted); never one without counts
        (a wrong backend, kernel or function ran)."""
        if item.is_proof:
            excuse = self.evidence.get(item.check) if self.status == "FAIL" else None
            return excuse is not None and excuse.names_a_proof and excuse.covers(item)
        if item.is_error:
            texts = (self.error_contains,) if isinstance(self.error_contains, str) else self.error_contains
            return self.status == "ERROR" and any(text in item.text for text in texts if text)
        excuse = self.evidence.get(item.check)
        return self.status == "FAIL" and excuse is not None and excuse.covers(item)

    def excuses_hang(self, stacks: str) -> bool:
        """Whether a TIMEOUT whose ranks' stacks (and reason) are `stacks` is this known hang."""
        texts = (self.error_contains,) if isinstance(self.error_contains, str) else self.error_contains
        return self.status == "TIMEOUT" and any(text in stacks for text in texts if text)

    def covers(self, version: str | None = None) -> bool:
        """Whether the entry applies to diffusers `version` (default: the installed one)."""
        if not self.diffusers:
            return True
        if version is None:
            from harness.core.compat import installed_version

            version = installed_version()
        return SpecifierSet(self.diffusers).contains(Version(version), prereleases=True)

    @property
    def finding(self) -> str:
        """What kind of finding it is (SEVERITIES): as the entry says, else silently wrong for a FAIL entry and a
        crash for an ERROR entry."""
        return self.severity or DEFAULT_SEVERITY[self.status]

    @property
    def is_refusal(self) -> bool:
        return self.finding == REFUSAL

    def describe(self) -> str:
        head = "expected refusal" if self.is_refusal else "known issue"
        return f"{head}: {self.reason}" + (f" ({self.link})" if self.link else "")

    @property
    def heading(self) -> str:
        """The entry in a few words: its title, or its reason's first clause."""
        head = self.title or self.reason.split(":")[0].split(";")[0]
        return f"{head[:80]}{'...' if len(head) > 80 else ''}"

    @property
    def short(self) -> str:
        """The entry in a few words and where it is."""
        return f"{self.heading} [{self.key}]"

    def reference(self) -> dict[str, str]:
        """What a result keeps of the entry (CaseResult.known_issues): where it is, its name, its traced cause."""
        found = {"key": self.key, "title": self.heading, "link": self.link, "severity": self.finding}
        return {**found, "upstream": self.upstream} if self.upstream else found

    def band(self, item: Evidence) -> tuple[float, float] | None:
        """The measured band this entry excuses `item`'s figure in (None: an error, or a check without a band)."""
        excuse = self.evidence.get(item.check) if self.status == "FAIL" else None
        return excuse.band if excuse is not None else None


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
        fields[key] = _texts(where, key, fields.get(key, ""))
    modes = fields.get("modes", [])
    if not isinstance(modes, list) or not all(isinstance(mode, str) for mode in modes):
        raise HarnessError(f"{where}: 'modes' must be a list of modes, e.g. [\"compile\"]")
    unknown_modes = [mode for mode in modes if mode not in MODES]
    if unknown_modes:
        raise HarnessError(f"{where}: unknown modes {unknown_modes} in 'modes'; valid modes: {', '.join(MODES)}")
    fields["modes"] = tuple(modes)
    loads = fields.get("loads", [])
    if not isinstance(loads, list) or any(load not in LOADS for load in loads):
        raise HarnessError(f"{where}: 'loads' must be a list of loads, e.g. [\"pretrained\"]; valid loads: "
                           f"{', '.join(LOADS)}")
    fields["loads"] = tuple(loads)
    for key in ("title", "reason", "link", "upstream", "diffusers", "status", "severity"):
        if not isinstance(fields.get(key, ""), str):
            raise HarnessError(f"{where}: '{key}' must be a string")
    if not str(fields.get("upstream", "https://")).startswith("https://"):
        raise HarnessError(f"{where}: 'upstream' must be the https:// address of the upstream issue or pull request")
    _status(where, fields)
    if fields.get("diffusers"):
        try:
            SpecifierSet(fields["diffusers"])
        except InvalidSpecifier:
            raise HarnessError(f"{where}: 'diffusers' = {fields['diffusers']!r} is not a version range; write e.g. "
                               f"\">=0.37,<0.40\"") from None
    return KnownIssue(**fields, key=f"{path.name} #{index + 1}")


def _status(where: str, fields: dict) -> None:
    """What the entry's status asks of it: an ERROR entry its error's text, a TIMEOUT entry a text of the ranks'
    stacks, a FAIL entry its checks' tables; and a severity of SEVERITIES that fits it (a refusal is an error)."""
    status = fields.setdefault("status", "FAIL" if "evidence" in fields else "ERROR")
    if status not in ("ERROR", "FAIL", "TIMEOUT"):
        raise HarnessError(f"{where}: 'status' must be FAIL, ERROR or TIMEOUT")
    if status in ("ERROR", "TIMEOUT"):
        what = "the error it expects" if status == "ERROR" else "a text of the ranks' stacks when they hang"
        if "evidence" in fields:
            raise HarnessError(f"{where}: an {status} entry excuses it by its text ('error_contains'); "
                               "[issue.evidence.<check>] tables are for status = \"FAIL\"")
        if not fields.get("error_contains"):
            raise HarnessError(f"{where} needs 'error_contains': {what}, so that another failure of the same cases "
                               "stays visible")
    else:
        if fields.get("error_contains"):
            raise HarnessError(f"{where}: a FAIL entry names its checks in [issue.evidence.<check>] tables (with "
                               "'contains' for a text), not 'error_contains'")
        fields["evidence"] = _excuses(where, fields.get("evidence"))
    severity = fields.get("severity") or DEFAULT_SEVERITY[status]
    if severity not in SEVERITIES:
        raise HarnessError(f"{where}: 'severity' must be one of {', '.join(repr(s) for s in SEVERITIES)}")
    if severity == REFUSAL and status != "ERROR":
        raise HarnessError(f"{where}: a refusal is an error diffusers raises with its own message: status = "
                           "\"ERROR\" with its text in 'error_contains'")


def _texts(where: str, key: str, value) -> str | tuple[str, ...]:
    if isinstance(value, list):
        if not value or not all(isinstance(item, str) and item for item in value):
            raise HarnessError(f"{where}: '{key}' must be a string or a non-empty list of non-empty strings")
        return tuple(value)
    if not isinstance(value, str):
        raise HarnessError(f"{where}: '{key}' must be a string or a list of strings, not {type(value).__name__}")
    return value


def _excuses(where: str, tables) -> dict[str, Excuse]:
    """The `[issue.evidence.<check>]` tables: known checks only, each with its measured band, and its subjects where
    the check names one."""
    from harness.kinds import known_checks

    if not isinstance(tables, dict) or not tables:
        raise HarnessError(f"{where}: a FAIL entry needs at least one [issue.evidence.<check>] table naming the "
                           "check it excuses, its measured band and its subjects")
    from harness.kinds.base import Check

    checks = {**known_checks(), **{name: Check(subjects) for name, subjects in PROOFS.items()}}
    excuses = {}
    for check, table in tables.items():
        at = f"{where} [issue.evidence.{check}]"
        if check not in checks:
            raise HarnessError(f"{at}: unknown check; valid checks: {', '.join(sorted(checks))}")
        if not isinstance(table, dict) or set(table) - _EXCUSE_KEYS:
            raise HarnessError(f"{at}: valid keys are {', '.join(sorted(_EXCUSE_KEYS))}")
        band = table.get("band")
        if band is not None or checks[check].figure:
            if not (isinstance(band, list) and len(band) == 2 and all(isinstance(v, int | float) for v in band)
                    and band[0] <= band[1]):
                raise HarnessError(f"{at} needs 'band': the measured [low, high] of the check's figure, e.g. "
                                   "[0.2, 0.4]")
            band = (float(band[0]), float(band[1]))
        subjects = table.get("subjects", [])
        if checks[check].subjects and not subjects:
            raise HarnessError(f"{at} needs 'subjects': the {checks[check].subjects} the check failed on (globs)")
        if not isinstance(subjects, list) or not all(isinstance(item, str) and item for item in subjects):
            raise HarnessError(f"{at}: 'subjects' must be a list of globs")
        if not isinstance(table.get("contains", ""), str):
            raise HarnessError(f"{at}: 'contains' must be a string")
        limit = _limit(at, check, table.get("limit"))
        excuses[check] = Excuse(tuple(subjects), band, table.get("contains", ""), limit)
    return excuses


def _limit(at: str, check: str, limit) -> tuple[float, float] | None:
    """A check's `limit` band: required for a proof (the counts predicted, as `band` holds the counts seen)."""
    if limit is None and check not in PROOFS:
        return None
    if not (isinstance(limit, list) and len(limit) == 2 and all(isinstance(v, int | float) for v in limit)
            and limit[0] <= limit[1]):
        raise HarnessError(f"{at} needs 'limit': the [low, high] of the limit it failed, for a proof the counts "
                           "predicted (e.g. [4, 4] all-to-alls), beside 'band', the counts seen (e.g. [0, 0])")
    return float(limit[0]), float(limit[1])
