"""Results are data first: a `Status` enum and one serializable record per case.

results.json is `{"header": {...}, "tracebacks": [text, ...], "cases": [record, ...]}`: a full plan's XFAIL cases
repeat the same few tracebacks thousands of times, so each distinct one is written once in `tracebacks` and a case's
`extra["traceback"]` holds its index there. `read_results`, the one reader of the file, resolves the indices again; a
record whose traceback is text (older files, results.partial.jsonl) reads as it is.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from harness.core import figures
from harness.core.errors import HarnessError
from harness.core.header import RunHeader

RESULTS_FILE = "results.json"  # the file a run writes in its report folder, the source of every view
# What kind of finding a known issue is (a known_issues.toml entry's `severity`), most severe first: the order every
# view lists them in. A REFUSED case is a refusal; an XFAIL the worst of the entries that excused it.
SEVERITIES = ("silently wrong", "crash", "hang", "refusal")
REFUSAL = "refusal"


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    SKIP = "SKIP"
    TIMEOUT = "TIMEOUT"
    XFAIL = "XFAIL"  # a known bug (known_issues.toml) that excuses exactly the evidence it names
    # diffusers refused, with its own message, what it does not support, as the plan or a known-issue entry expected:
    # its correct behaviour, tested as a refusal; neither a failure nor a known bug (files older than it read XFAIL)
    REFUSED = "REFUSED"
    XPASS = "XPASS"  # a known issue that no longer reproduces: news, and with `xfail_strict` a failure
    # The combination cannot exist (diffusers refuses it, the model has no plan for the layout): decided at plan time
    # like a SKIP, but nothing could make it run (harness.core.applicability); files older than it read as before
    NOT_APPLICABLE = "N/A"

    @property
    def ran(self) -> bool:
        """Whether the case ran at all: SKIP and N/A did not."""
        return self not in (Status.SKIP, Status.NOT_APPLICABLE)

    @property
    def needs_a_look(self) -> bool:
        """Listed first everywhere: the failures, and a known issue that no longer reproduces."""
        return self.is_bad or self is Status.XPASS

    def is_failure(self, xfail_strict: bool = False) -> bool:
        """Whether this status fails the run: FAIL, ERROR and TIMEOUT always, XPASS under `xfail_strict`."""
        return self.is_bad or (xfail_strict and self is Status.XPASS)

    @property
    def is_bad(self) -> bool:
        """Statuses that make `harness run` exit non-zero."""
        return self in (Status.FAIL, Status.ERROR, Status.TIMEOUT)


@dataclass
class CaseResult:
    """One planned case after running and judging; every view (CSV, Markdown, HTML) renders from these."""

    case_id: str
    model: str
    shape: str
    kind: str
    layout: str
    world_size: int
    backend: str
    dtype: str
    status: Status = Status.ERROR
    # What the case's kind measured, in its order (harness.core.figures: name, label, value, limit, format)
    figures: list[dict[str, Any]] = field(default_factory=list)
    first_divergence: str | None = None  # localized: the first module whose output left the single-device run's
    dispatched: str = ""
    kernels: str = ""
    comms: str = ""  # the collectives of the case's run (harness.rank.comms_check.totals); "" on one rank
    reason: str = ""
    # Each failed check (harness.core.evidence.Evidence as a dict; `known`: the entry that excuses it)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    seconds: float | None = None
    peak_mem_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    mode: str = "eager"  # eager or compiled (harness.core.modes); it and what follows come last, so positional
    # records read as before
    # The known_issues.toml entries that excused its evidence (or, for an XPASS, that list it), each {"key", "title",
    # "link"}: what a view names and links an XFAIL by; an excused item of `evidence` names its entry's key in
    # "known" and, where the entry measured one, the band its figure sat in ("band": [low, high]).
    known_issues: list[dict[str, str]] = field(default_factory=list)
    load: str = "enable"  # enable_parallelism or from_pretrained (harness.loads)
    # The check that decided it (harness.core.figures.deciding: the one that used most of its allowance, with its
    # limit's derivation and `margin`); None where no check has a number, or in a file written before it
    deciding: dict[str, Any] | None = None
    flow: str = "none"  # what the user calls around enable_parallelism (harness.flows)
    # A rank died of a native signal (SIGSEGV, SIGABRT, ...) in an earlier attempt: that attempt's {"error",
    # "traceback"} (the dead rank's stack). The case ran once more in a fresh group; this result is the rerun's (a
    # second death is its ERROR). None: no rank died.
    rank_death: dict[str, str] | None = None

    def figure(self, name: str) -> Any:
        """The value of the figure `name` (None when the case has none)."""
        return figures.value(self.figures, name)

    @property
    def severity(self) -> str:
        """What kind of finding an XFAIL or REFUSED case is (SEVERITIES), the worst of its entries'; "" for any other
        status. A file from before severities: a refusal by its reason, else by what its entries excused (a check
        with numbers: silently wrong; an error: a crash)."""
        if self.status is Status.REFUSED:
            return REFUSAL
        if self.status is not Status.XFAIL:
            return ""
        found = [entry.get("severity") for entry in self.known_issues if entry.get("severity") in SEVERITIES]
        if found:
            return min(found, key=SEVERITIES.index)
        if not self.known_issues:
            return REFUSAL if self.reason.startswith("expected refusal") else "crash"
        wrong = any(item.get("known") and item.get("check") != "error" for item in self.evidence)
        return "silently wrong" if wrong else "crash"  # what its entries excused: numbers, or an error

    def known_issue(self, key: str) -> dict[str, str] | None:
        """The entry `key` (an excused item's "known") as this case carries it, or None."""
        return next((entry for entry in self.known_issues if entry.get("key") == key), None)

    @property
    def cell(self) -> str:
        """The matrix cell's text: the deciding check and how much of its allowance it used, else the key figure
        ("" for none). A check held exactly to its ideal that met it (a repeat bit for bit alike) says nothing a
        kind's key figure would not: the key figure is written then."""
        met_exactly = self.deciding and figures.is_exact(self.deciding) and not float(self.deciding["margin"])
        if self.deciding and not (met_exactly and figures.cell(self.figures)):
            return figures.decided_cell(self.deciding)
        return figures.cell(self.figures)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return {key: _finite_or_none(value) for key, value in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], tracebacks: list[str] | None = None) -> CaseResult:
        """The record back; `tracebacks` is results.json's table, which `extra["traceback"]` may index."""
        names = {f.name for f in fields(cls)}
        known = {key: value for key, value in resolved(data, tracebacks).items() if key in names}
        known["status"] = Status(known.get("status", "ERROR"))
        return cls(**known)


def _finite_or_none(value):
    """JSON has no NaN/Inf: they are written as the strings "nan", "inf" and "-inf" (the count of non-finite values
    of an output is a figure of its own)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_finite_or_none(item) for item in value]
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    return value


TRACEBACK = "traceback"  # the key of `extra` that results.json writes as an index into its `tracebacks`


def resolved(case: dict[str, Any], tracebacks: list[str] | None) -> dict[str, Any]:
    """`case` with its traceback as text: an index into `tracebacks` is looked up (an index without a table, or
    out of it, is a ValueError: the file is not whole); text is kept."""
    extra = case.get("extra")
    index = extra.get(TRACEBACK) if isinstance(extra, dict) else None
    if not isinstance(index, int) or isinstance(index, bool):
        return case
    if tracebacks is None or not 0 <= index < len(tracebacks):
        raise ValueError(f"case {case.get('case_id')!r}: traceback #{index} is not in the file's tracebacks table")
    return {**case, "extra": {**extra, TRACEBACK: tracebacks[index]}}


def payload_of(results: list[CaseResult], header: RunHeader) -> dict[str, Any]:
    """What results.json holds: each distinct traceback once, the cases pointing at it."""
    table: dict[str, int] = {}
    cases = []
    for result in results:
        case = result.to_dict()
        text = case["extra"].get(TRACEBACK)
        if isinstance(text, str):
            case["extra"] = {**case["extra"], TRACEBACK: table.setdefault(text, len(table))}
        cases.append(case)
    return {"header": header.to_dict(), "tracebacks": list(table), "cases": cases}


def write_results(path: Path, results: list[CaseResult], header: RunHeader) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(_one_case_a_line(payload_of(results, header)))
    tmp.replace(path)


def _one_case_a_line(payload: dict[str, Any]) -> str:
    """The file's text: the header indented, each traceback and each case on a line of its own. Still one JSON
    document, and a case stays one line to grep or diff; indenting every case's figures made a quick plan's file
    3.6 MB of the 5.1 MB a CI job uploads (2.9 MB this way)."""
    header = json.dumps(payload["header"], indent=1)
    rows = {key: ",\n".join(json.dumps(item) for item in payload[key]) for key in ("tracebacks", "cases")}
    return (f'{{"header": {header},\n"tracebacks": [\n{rows["tracebacks"]}\n],\n'
            f'"cases": [\n{rows["cases"]}\n]}}\n')


_RUN_IT_FIRST = "run `harness run` first, or point at the folder it wrote (its --report-dir)"


def read_results(path: Path, what_to_do: str = _RUN_IT_FIRST) -> tuple[RunHeader, list[CaseResult]]:
    """The header and the cases of a results.json, as the records they were written from: the one reader of the
    file (every view, `harness merge`, `harness ab`, the benchmarks). A missing, unreadable or foreign file is a
    HarnessError that names it and says `what_to_do`; a case the file left fields out of still reads (`_lenient`)."""
    path = Path(path)
    if not path.is_file():
        raise HarnessError(f"no results at {path}; {what_to_do}")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: invalid JSON or not UTF-8
        raise HarnessError(f"{path} cannot be read as JSON ({error}); {what_to_do}") from error
    if not _is_results(payload):
        raise HarnessError(f"{path} is not a harness results file (expected an object with a \"cases\" list of "
                           f"objects); {what_to_do}")
    try:
        cases = [_lenient(resolved(case, payload.get("tracebacks"))) for case in payload["cases"]]
    except ValueError as error:  # a traceback index without its table
        raise HarnessError(f"{path} is not whole ({error}); {what_to_do}") from error
    return RunHeader.from_dict(payload.get("header") or {}), cases


def _is_results(payload: Any) -> bool:
    """The shape write_results gives: {"header": {...}, "tracebacks": [...], "cases": [{...}, ...]}."""
    if not isinstance(payload, dict) or not isinstance(payload.get("header") or {}, dict):
        return False
    cases = payload.get("cases")
    return isinstance(cases, list) and all(isinstance(case, dict) for case in cases)


# The fields people read as text: never None in a view (from CaseResult's annotations).
TEXT = tuple(f.name for f in fields(CaseResult) if f.type in ("str", "str | None", "Status"))
_CONTAINERS = {f.name: f.default_factory for f in fields(CaseResult) if f.default_factory is not MISSING}
_TEXT_DEFAULTS = {f.name: str(f.default) if isinstance(f.default, str) else "" for f in fields(CaseResult)
                  if f.name in TEXT}


def _lenient(case: dict[str, Any]) -> CaseResult:
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
    if status not in {member.value for member in Status}:
        given["reason"] = (f"results.json gives the status {status or '(none)'!r}, which this report does not know"
                           + (f"; {given['reason']}" if given["reason"] else ""))
        status = Status.ERROR.value
    given["status"] = status
    return CaseResult.from_dict(given)
