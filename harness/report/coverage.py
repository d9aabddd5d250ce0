"""The page's coverage section and the summary line of matrix.md (`harness run --coverage`): which of diffusers'
parallel code the run executed, read from results.json's header through its typed record (harness.core.coverage).

A table with one row per module (statements measured, executed, and those never executed by reason), then each
module's functions that left statements unexecuted, the functions with an unknown gap first, each reason with the
lines it holds: each function links to its lines in diffusers' source at the installed release. Nothing is drawn by
the page script: the section is plain HTML (and its own small stylesheet), so it reads the same with JavaScript off.
"""

from __future__ import annotations

from html import escape

from harness.core.coverage import (
    CATEGORIES,
    CUDA_ONLY,
    UNKNOWN,
    CoverageReport,
    FunctionCoverage,
    ModuleCoverage,
    percent,
    read,
)
from harness.core.header import RunHeader

ANCHOR = "coverage"
WHY_CHARS = 160  # a reason longer than this is cut on the page (results.json holds it whole)
# The section's own look, scoped to it (the page's stylesheet knows nothing of it).
STYLE = ("#coverage table.cases td.n{text-align:right}"
         "#coverage .gap{display:inline-block;padding:0 5px;border-radius:3px;font-size:11.5px;white-space:nowrap}"
         "#coverage .g-unknown{background:#ffebe9;color:#a40e26}#coverage .g-other{background:#f6f8fa;"
         "color:#57606a}#coverage details.module{margin:6px 0}#coverage ul.gaps{margin:2px 0 8px 18px;padding:0}"
         "#coverage ul.gaps li{list-style:none;font-size:12.5px}")


def summary_line(header: RunHeader) -> str | None:
    """The one line matrix.md carries (None when the run measured no coverage)."""
    report = read(header)
    return None if report is None else report.summary()


def coverage_section(header: RunHeader) -> str:
    """The section, or "" when the run measured no coverage."""
    report = read(header)
    if report is None:
        return ""
    note = f'<p class="muted">{escape(report.note)}</p>' if report.note else ""
    groups = "".join(_group(report, name) for name in report.groups)
    return (f'<section id="{ANCHOR}"><style>{STYLE}</style><h2>Coverage of diffusers\' parallel code</h2>'
            f"<p>Statements of function bodies, from every rank of {report.processes} "
            f"process{'' if report.processes == 1 else 'es'}.</p>{note}{groups}</section>")


def _group(report: CoverageReport, name: str) -> str:
    """One group of modules (the parallel code; the code the flows touch, when the run had flows): its line, its
    table, its modules' gaps."""
    modules = report.group(name)
    gaps = "".join(_module_gaps(module) for module in modules if module.functions)
    return (f'<div class="coverage-group" data-coverage-group="{escape(name)}"><h3>{escape(name.capitalize())}</h3>'
            f"<p>{escape(report.group_summary(name))}</p>{_table(modules)}{gaps}</div>")


def _table(modules: list[ModuleCoverage]) -> str:
    heads = "".join(f'<th scope="col">{escape(name)}</th>' for name in CATEGORIES)
    rows = "".join(_row(module) for module in modules)
    return ('<table class="cases coverage-table"><thead><tr><th scope="col">module</th><th scope="col">measured</th>'
            f'<th scope="col">executed</th><th scope="col">%</th>{heads}</tr></thead><tbody>{rows}</tbody></table>')


def _row(module: ModuleCoverage) -> str:
    name = _link(module.source, f"<code>{escape(module.key)}</code>")
    if module.absent:
        return (f'<tr><td>{name}</td><td colspan="{3 + len(CATEGORIES)}" class="muted">{escape(module.absent)}'
                "</td></tr>")
    tally = module.by_category()
    cells = "".join(f'<td class="n">{tally.get(name, 0)}</td>' for name in CATEGORIES)
    return (f'<tr data-module="{escape(module.key)}"><td>{name}<div class="muted">{escape(module.title)}</div></td>'
            f'<td class="n">{module.statements}</td><td class="n">{module.executed}</td>'
            f'<td class="n">{escape(percent(module.executed, module.statements))}</td>{cells}</tr>')


def _module_gaps(module: ModuleCoverage) -> str:
    """The module's functions that left statements unexecuted: those with an unknown gap first, then by how much
    never ran; the functions only a missing backend or device reaches in one line at the end."""
    functions = [f for f in module.functions if f.gaps]
    if not functions:
        return ""
    cuda = [f for f in functions if all(gap.category == CUDA_ONLY for gap in f.gaps)]
    rest = sorted((f for f in functions if f not in cuda),
                  key=lambda f: (not any(gap.category == UNKNOWN for gap in f.gaps), -len(f.missing), f.first))
    items = "".join(_function(module, f) for f in rest)
    if cuda:
        names = ", ".join(f'{_link(_lines(module.source, f.first, f.last), escape(f.name), f.gaps[0].why)} '
                          f"({len(f.missing)})" for f in cuda)
        items += f'<p class="cuda"><span class="gap g-other">{escape(CUDA_ONLY)}</span> {names}</p>'
    return (f'<details class="module" data-module="{escape(module.key)}"><summary><code>{escape(module.key)}</code>: '
            f"{len(functions)} function{'' if len(functions) == 1 else 's'} with statements never executed</summary>"
            f"{items}</details>")


def _function(module: ModuleCoverage, function: FunctionCoverage) -> str:
    """The function linked to its lines, then each reason once with the lines it holds (L12, L15-L18)."""
    head = _link(_lines(module.source, function.first, function.last), f"<code>{escape(function.name)}</code>")
    reasons: dict[tuple[str, str], list[str]] = {}
    for gap in function.gaps:
        first, last = gap.span
        reasons.setdefault((gap.category, gap.why), []).append(f"L{first}" + (f"-{last}" if last != first else ""))
    gaps = "".join(f'<li><span class="gap {"g-unknown" if category == UNKNOWN else "g-other"}">{escape(category)}'
                   f"</span> {', '.join(spans)}: {escape(_short(why))}</li>"
                   for (category, why), spans in reasons.items())
    return (f'<div class="function" data-function="{escape(function.name)}">{head} '
            f'<span class="muted">{len(function.executed)} of {len(function.statements)} executed</span>'
            f'<ul class="gaps">{gaps}</ul></div>')


def _short(text: str) -> str:
    return text if len(text) <= WHY_CHARS else text[: WHY_CHARS - 3] + "..."


def _lines(source: str, first: int, last: int) -> str:
    if not source:
        return ""
    return f"{source}#L{first}" + (f"-L{last}" if last != first else "")


def _link(url: str, text: str, title: str = "") -> str:
    hover = f' title="{escape(title)}"' if title else ""
    return f'<a href="{escape(url)}"{hover}>{text}</a>' if url else text
