"""`harness ab --coverage`: how the coverage of diffusers' parallel code changed from the base to the head.

Line numbers move between revisions, so functions are matched by module and name: a function new in the head (or
one that grew) whose statements the plan never executed is parallel code a PR adds that the plan does not run, said
first; then each module's figure on both sides, and the functions that lost executed statements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from harness.core.coverage import CoverageReport, FunctionCoverage, percent, read
from harness.core.header import RunHeader


@dataclass
class CoverageChanges:
    lines: list[str] = field(default_factory=list)  # what the terminal and matrix.md say, the summary first

    @property
    def markdown(self) -> str:
        if not self.lines:
            return ""
        return "\n".join(["### Coverage of diffusers' parallel code", "", *(f"- {line}" for line in self.lines), ""])


def compare(base_header: RunHeader, head_header: RunHeader) -> CoverageChanges:
    """The changes between two runs' coverage; nothing when neither side measured it, a line saying which side did
    not when only one did."""
    base, head = read(base_header), read(head_header)
    if base is None and head is None:
        return CoverageChanges()
    if base is None or head is None:
        return CoverageChanges([f"coverage: only the {'head' if base is None else 'base'} measured it (run both "
                                "sides with --coverage)"])
    lines = [f"coverage: base {base.executed}/{base.statements} ({percent(base.executed, base.statements)}), head "
             f"{head.executed}/{head.statements} ({percent(head.executed, head.statements)})"]
    lines += unrun_in_head(base, head)
    lines += _modules(base, head)
    lines += _lost(base, head)
    return CoverageChanges(lines)


def unrun_in_head(base: CoverageReport, head: CoverageReport) -> list[str]:
    """Parallel code the head adds (a new function, or more statements in one) that the plan never executed."""
    before = _functions(base)
    out = []
    for key, function in _functions(head).items():
        old = before.get(key)
        added = len(function.statements) - (len(old.statements) if old else 0)
        unrun = len(function.missing) - (len(old.missing) if old else 0)
        if added > 0 and unrun > 0:
            what = "new in the head" if old is None else f"{added} statement(s) more in the head"
            why = "; ".join(sorted({f"{gap.category}: {gap.why}" for gap in function.gaps}))[:300]
            out.append(f"parallel code the plan never runs: {key[0]}: {key[1]} ({what}; {unrun} never executed"
                       + (f"; {why}" if why else "") + ")")
    return out


def _modules(base: CoverageReport, head: CoverageReport) -> list[str]:
    old = {(module.group, module.key): module for module in base.modules}  # a file may be in both groups
    out = []
    for module in head.modules:
        was = old.get((module.group, module.key))
        if was is None or (was.executed, was.statements) != (module.executed, module.statements):
            before = "absent" if was is None else f"{was.executed}/{was.statements}"
            out.append(f"{module.key}: {before} -> {module.executed}/{module.statements} "
                       f"({percent(module.executed, module.statements)})")
    return out


def _lost(base: CoverageReport, head: CoverageReport) -> list[str]:
    after = _functions(head)
    return [f"executed less: {key[0]}: {key[1]} ({len(function.executed)} -> {len(after[key].executed)} of "
            f"{len(after[key].statements)})"
            for key, function in _functions(base).items()
            if key in after and len(after[key].executed) < len(function.executed)]


def _functions(report: CoverageReport) -> dict[tuple[str, str], FunctionCoverage]:
    return {(module.key, function.name): function for module in report.modules for function in module.functions}


def page_section(changes: CoverageChanges) -> str:
    """The same lines on the ab page ("" when neither side measured coverage)."""
    if not changes.lines:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in changes.lines)
    return f"<h2>Coverage of diffusers' parallel code</h2><ul>{items}</ul>"
