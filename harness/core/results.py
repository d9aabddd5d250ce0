"""Results are data first: a `Status` enum and one serializable record per case.

results.json is `{"header": {...}, "tracebacks": [text, ...], "cases": [record, ...]}`: a full plan's XFAIL cases
repeat the same few tracebacks thousands of times, so each distinct one is written once in `tracebacks` and a case's
`extra["traceback"]` holds its index there. `read_results` / `cases_of` resolve the indices again; a record whose
traceback is text (older files, results.partial.jsonl) reads as it is.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from harness.core import figures


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    SKIP = "SKIP"
    TIMEOUT = "TIMEOUT"
    XFAIL = "XFAIL"
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
    load: str = "enable"  # enable_parallelism or from_pretrained (harness.core.loads)
    # The check that decided it (harness.core.figures.deciding: the one that used most of its allowance, with its
    # limit's derivation and `margin`); None where no check has a number, or in a file written before it
    deciding: dict[str, Any] | None = None

    def figure(self, name: str) -> Any:
        """The value of the figure `name` (None when the case has none)."""
        return figures.value(self.figures, name)

    def known_issue(self, key: str) -> dict[str, str] | None:
        """The entry `key` (an excused item's "known") as this case carries it, or None."""
        return next((entry for entry in self.known_issues if entry.get("key") == key), None)

    @property
    def cell(self) -> str:
        """The matrix cell's text: the deciding check and how much of its allowance it used, else the key figure
        ("" for none)."""
        return figures.decided_cell(self.deciding) if self.deciding else figures.cell(self.figures)

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


def payload_of(results: list[CaseResult], header: dict[str, Any]) -> dict[str, Any]:
    """What results.json holds: each distinct traceback once, the cases pointing at it."""
    table: dict[str, int] = {}
    cases = []
    for result in results:
        case = result.to_dict()
        text = case["extra"].get(TRACEBACK)
        if isinstance(text, str):
            case["extra"] = {**case["extra"], TRACEBACK: table.setdefault(text, len(table))}
        cases.append(case)
    return {"header": header, "tracebacks": list(table), "cases": cases}


def cases_of(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The case records of a results.json payload, tracebacks as text."""
    tracebacks = payload.get("tracebacks")
    return [resolved(case, tracebacks) for case in payload["cases"]]


def read_results(path: Path) -> tuple[dict[str, Any], list[CaseResult]]:
    """The header and the cases of a results.json (OSError, ValueError, KeyError or TypeError when it is not one)."""
    payload = json.loads(Path(path).read_text(encoding="utf-8"))
    return payload.get("header") or {}, [CaseResult.from_dict(case) for case in cases_of(payload)]


def write_results(path: Path, results: list[CaseResult], header: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload_of(results, header), indent=1))
    tmp.replace(path)
