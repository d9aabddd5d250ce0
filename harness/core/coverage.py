"""Which of diffusers' parallel code a run executed (`harness run --coverage`), typed: what results.json's header holds
under `coverage`, what the page, matrix.md and `harness ab` read back.

A module of diffusers' parallel code (harness.catalogue.coverage) is measured on the statements of its parallel code
paths: per function, the statements executed by some rank of some case, and every statement never executed with the
reason it was not (a `Gap`): a backend or device this machine lacks, a refusal of diffusers' that no case provokes, a
value of an axis the plan did not run, or unknown. Executed lines are kept (not only counts), so the reports of two
shards merge and two revisions compare function by function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from harness.core.header import RunHeader

# Why a statement never ran: each gap is one of these, in this order of precedence.
CUDA_ONLY = "CUDA-only"  # a backend or device this machine lacks
REFUSED = "refused by diffusers"  # diffusers' own refusal, and no case provokes it
NOT_IN_PLAN = "not in this plan"  # a value of an axis (or a check) that reaches it, not run here
UNKNOWN = "unknown"  # nothing the harness knows explains it: a gap to look at
CATEGORIES = (CUDA_ONLY, REFUSED, NOT_IN_PLAN, UNKNOWN)
# The groups of measured modules (harness.catalogue.coverage.scope), as the reports name them.
PARALLEL = "parallel code"
FLOWS = "code the flows touch under parallelism"  # measured when a run has flows


@dataclass
class Gap:
    """Never-executed statements of one function with one reason: `lines` are their first lines in the file."""

    lines: list[int]
    category: str
    why: str

    @property
    def span(self) -> tuple[int, int]:
        return min(self.lines), max(self.lines)


@dataclass
class FunctionCoverage:
    """One function (or method: `Class.method`) of a measured module: its statements in scope and those that ran."""

    name: str
    first: int  # its line range in the file, for the links to its source
    last: int
    statements: list[int]
    executed: list[int]
    gaps: list[Gap] = field(default_factory=list)

    @property
    def missing(self) -> list[int]:
        ran = set(self.executed)
        return [line for line in self.statements if line not in ran]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FunctionCoverage:
        known = {f.name for f in fields(cls)}
        given = {key: value for key, value in data.items() if key in known}
        given["gaps"] = [Gap(**gap) for gap in given.get("gaps", [])]
        return cls(**given)


@dataclass
class ModuleCoverage:
    """One module of diffusers' parallel code: where it is, what of it is measured, and each function's figures.
    `absent` says why a module of the list is not measured (the installed diffusers has no such module)."""

    key: str  # its path inside the diffusers package, e.g. hooks/context_parallel.py
    title: str  # what part of it is measured
    functions: list[FunctionCoverage] = field(default_factory=list)
    absent: str = ""
    source: str = ""  # the URL of the file at the installed diffusers' release ("" when unknown)
    group: str = PARALLEL

    @property
    def statements(self) -> int:
        return sum(len(f.statements) for f in self.functions)

    @property
    def executed(self) -> int:
        return sum(len(f.executed) for f in self.functions)

    def by_category(self) -> dict[str, int]:
        return _tally(gap for f in self.functions for gap in f.gaps)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "absent": self.absent, "source": self.source,
                "group": self.group, "statements": self.statements, "executed": self.executed,
                "functions": [f.to_dict() for f in self.functions]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModuleCoverage:
        functions = [FunctionCoverage.from_dict(f) for f in data.get("functions", [])]
        return cls(data["key"], data.get("title", ""), functions, data.get("absent", ""), data.get("source", ""),
                   data.get("group", PARALLEL))


@dataclass
class CoverageReport:
    """The whole measurement: the diffusers it measured, its modules, and how the ranks' data were gathered."""

    diffusers: str
    modules: list[ModuleCoverage]
    processes: int = 0  # rank processes whose data were combined
    note: str = ""  # what the reader must know besides (data lost with a killed rank, ...)

    @property
    def statements(self) -> int:
        return sum(m.statements for m in self.modules)

    @property
    def executed(self) -> int:
        return sum(m.executed for m in self.modules)

    def by_category(self) -> dict[str, int]:
        return _tally(gap for m in self.modules for f in m.functions for gap in f.gaps)

    def group(self, name: str) -> list[ModuleCoverage]:
        return [m for m in self.modules if m.group == name]

    @property
    def groups(self) -> list[str]:
        return list(dict.fromkeys(m.group for m in self.modules))

    def summary(self) -> str:
        """The one line results.json, matrix.md and the terminal carry: each group measured, the parallel code first."""
        return "; and ".join(self.group_summary(name) for name in self.groups or [PARALLEL])

    def group_summary(self, name: str) -> str:
        modules = self.group(name)
        statements, executed = sum(m.statements for m in modules), sum(m.executed for m in modules)
        if not statements:
            return f"diffusers {self.diffusers} {name}: nothing measured"
        tally = _tally(gap for m in modules for f in m.functions for gap in f.gaps)
        why = ", ".join(f"{tally[category]} {category}" for category in CATEGORIES if tally.get(category))
        return (f"diffusers {self.diffusers} {name}: {executed}/{statements} statements executed "
                f"({percent(executed, statements)}); {statements - executed} never" + (f": {why}" if why else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "diffusers": self.diffusers, "processes": self.processes,
                "note": self.note, "modules": [m.to_dict() for m in self.modules]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CoverageReport:
        return cls(data.get("diffusers", "?"), [ModuleCoverage.from_dict(m) for m in data.get("modules", [])],
                   data.get("processes", 0), data.get("note", ""))


def percent(part: int, whole: int) -> str:
    """`part` of `whole` as a percentage with one decimal ("-" for nothing measured)."""
    return f"{100.0 * part / whole:.1f} %" if whole else "-"


def _tally(gaps) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gap in gaps:
        counts[gap.category] = counts.get(gap.category, 0) + len(gap.lines)
    return counts


def read(header: RunHeader) -> CoverageReport | None:
    """The coverage of a run's header (None when the run did not measure it)."""
    data = header.coverage
    return CoverageReport.from_dict(data) if isinstance(data, dict) else None


def merge(reports: list[CoverageReport]) -> CoverageReport | None:
    """The parts of a sharded run as one (`harness merge`): a statement any part executed is executed; one that
    none did keeps the gravest of the parts' reasons (an axis value one part lacked and another ran without
    reaching the statement is unknown, not "not in this plan")."""
    if not reports:
        return None
    first = reports[0]
    functions: dict[tuple[str, str], list[FunctionCoverage]] = {}
    for report in reports:
        for module in report.modules:
            for function in module.functions:
                functions.setdefault((module.key, function.name), []).append(function)
    modules = []
    for module in first.modules:
        merged = []
        for function in module.functions:
            parts = functions[(module.key, function.name)]
            ran = sorted({line for part in parts for line in part.executed})
            merged.append(FunctionCoverage(function.name, function.first, function.last, function.statements, ran,
                                           _gravest(function.statements, ran, parts)))
        modules.append(ModuleCoverage(module.key, module.title, merged, module.absent, module.source, module.group))
    return CoverageReport(first.diffusers, modules, sum(r.processes for r in reports),
                          "; ".join(sorted({r.note for r in reports if r.note})))


def _gravest(statements: list[int], ran: list[int], parts: list[FunctionCoverage]) -> list[Gap]:
    by_line: dict[int, tuple[str, str]] = {}
    for part in parts:
        for gap in part.gaps:
            for line in gap.lines:
                reason = (gap.category, gap.why)
                if line not in by_line or CATEGORIES.index(reason[0]) > CATEGORIES.index(by_line[line][0]):
                    by_line[line] = reason
    gaps: list[Gap] = []
    for line in (line for line in statements if line not in set(ran)):
        category, why = by_line.get(line, (UNKNOWN, "no part gave a reason"))
        if gaps and (gaps[-1].category, gaps[-1].why) == (category, why):
            gaps[-1].lines.append(line)
        else:
            gaps.append(Gap([line], category, why))
    return gaps
