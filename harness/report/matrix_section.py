"""The matrix section of index.html: one closed section per model (the script draws its table when it is opened), a
legend of the statuses, of what a cell writes under its status, and of what each flow, load and mode value of the run
means. Its rows and columns follow the axes (axes.py)."""

from __future__ import annotations

from html import escape

from harness.core.figures import cell_figure
from harness.core.results import CaseResult
from harness.report import axes
from harness.report.data import BAD, STATUSES, ordered_statuses, unique
from harness.report.detail import badge

__all__ = ["matrix_section"]


def matrix_section(cases: list[CaseResult], values_help: dict | None = None) -> str:
    """One closed section per value of the section axis (a model), those with a failing case first and open; the
    script draws a section's table (rows and columns from axes.matrix) when it is first opened. Its legends say what
    a cell writes and what each flow, load and mode value of the run means (`values_help`)."""
    if not cases:
        return '<section id="matrix"><h2>Matrix</h2><p class="none">No cases in this run.</p></section>'
    layout = axes.matrix()
    key = layout["section"][0] if layout["section"] else None
    by_section: dict[str, list[str]] = {}
    for case in cases:
        by_section.setdefault(getattr(case, key) if key else "", []).append(case.status.value)
    failing = [value for value, statuses in by_section.items() if BAD.intersection(statuses)]
    order = failing + [value for value in by_section if value not in failing]
    sections = "".join(_section(value, by_section[value], value in failing) for value in order)
    legend = "".join(badge(s) for s in STATUSES)
    return (
        f'<section id="matrix"><h2>Matrix by {escape(key or "run")} ({len(order)} {escape(key or "run")}'
        f'{"" if len(order) == 1 else "s"}, {len(failing)} with failures)</h2>'
        f'<div class="legend">{legend}<span class="muted">rows {escape(" x ".join(layout["row"]))}, columns '
        f'{escape(" x ".join(layout["column"]))}; cell: status, then the case\'s key figure; hover for the reason, '
        "click or Enter for details, arrow keys move between cells. Rows and columns in which every case is SKIP or "
        f"N/A are left out unless asked for above.</span></div>{_cell_legend(cases)}"
        f"{_values_legend(cases, values_help or {})}{sections}"
        '<p class="none no-match" hidden>No case matches the filters.</p></section>'
    )


# What each legend of the axes' values says first (harness.run.axis_help writes what each value means)
VALUES_LEGENDS = {
    "flow": "Flows: what the user calls around enable_parallelism, one row under its layout's (\u21b3 name; "
            "name_after: the same calls after enable_parallelism), judged against one device making the same calls",
    "load": "Loads: how the model gets its weights and its parallelism, one row under its layout's (\u21b3 name)",
    "mode": "Modes: how the model runs (a column group)"}


def _values_legend(cases: list[CaseResult], values_help: dict[str, dict[str, str]]) -> str:
    """Per axis whose values the cases vary in, what each value means, as a closed list titled by what it is."""
    parts = []
    for axis, lead in VALUES_LEGENDS.items():
        present = unique(str(getattr(case, axis)) for case in cases)
        described = values_help.get(axis, {})
        if len(present) < 2 or not described:
            continue
        items = "".join(f'<dt><code>{escape(value)}</code></dt><dd>{escape(described.get(value, ""))}</dd>'
                        for value in present)
        parts.append(f'<details class="values-legend" data-axis="{escape(axis)}"><summary>{escape(lead)} '
                     f'({len(present)})</summary><dl>{items}</dl></details>')
    return "".join(parts)


def _section(value: str, statuses: list[str], open_: bool) -> str:
    tally = {status: statuses.count(status) for status in ordered_statuses(statuses)}
    counts = " ".join(f'<span class="badge s-{escape(s)}" data-status="{escape(s)}" data-total="{n}">{n} {escape(s)}'
                      "</span>" for s, n in tally.items())
    return (f'<details class="section" data-section="{escape(value)}"{" open" if open_ else ""}><summary>'
            f'<b class="section-name">{escape(value)}</b> <span class="muted section-count" '
            f'data-total="{len(statuses)}">{len(statuses)} cases</span> <span class="section-tally">{counts}</span>'
            '</summary><div class="section-body"></div></details>')


def _cell_legend(cases: list[CaseResult]) -> str:
    """What the figure under a cell's status is: each check that decided a case (its margin to its limit), else the
    key figure a kind declares with a cell format, by its label, with a cell it wrote (a non-zero one where there
    is) and the kinds whose cases write it, all read from the cases."""
    found: dict[tuple[str, str], list] = {}
    for case in cases:
        figure = case.deciding or cell_figure(case.figures)
        if figure is None:
            continue
        key = (str(figure.get("name", "")), str(figure.get("label") or figure.get("name", "")))
        entry = found.setdefault(key, [case.cell, bool(figure["value"]), []])
        if not entry[1] and figure["value"]:
            entry[:2] = [case.cell, True]
        if case.kind not in entry[2]:
            entry[2].append(case.kind)
    if not found:
        return ""
    items = "".join(
        f'<li data-figure="{escape(name)}"><code class="cell-example">{escape(example)}</code> '
        f'<span class="cell-label">{escape(label)}</span> <span class="muted">({escape(", ".join(kinds))} '
        "cases)</span></li>"
        for (name, label), (example, _, kinds) in found.items())
    return (f'<div class="cell-legend" id="cell-legend"><span>Under a cell\'s status, the check that decided its case '
            f"and the share of its limit it used (1.00x: at the limit), else its key "
            f"figure:</span><ul>{items}</ul></div>")
