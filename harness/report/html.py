"""`index.html`: one self-contained page rendered from results.json, readable offline, in CI artifacts and on paper."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from harness.report.assets import JS, page
from harness.report.compare import changed_markdown, compare_runs
from harness.report.data import (
    FILTER_KEYS,
    STATUSES,
    key_number,
    load,
    plain,
    row_label,
    short,
    slugs,
    status_counts,
    unique,
)
from harness.report.detail import badge, data_attrs, section

__all__ = ["render_html", "compare_runs", "changed_markdown", "page"]

ENV_KEYS = ("torch", "diffusers", "diffusers_commit", "python", "device")
DIFFERS = ' class="differs"'
EMPTY = ' class="empty"'
DASH = "\u2014"


def render_html(report_dir: Path) -> Path:
    """Write `report_dir/index.html` from `report_dir/results.json`; images are linked relative to that folder."""
    report_dir = Path(report_dir)
    header, cases = load(report_dir)
    out = report_dir / "index.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(render_page(header, cases), encoding="utf-8")
    tmp.replace(out)
    return out


def render_page(header: dict[str, Any], cases: list[dict[str, Any]]) -> str:
    """The whole document as a string, so tests and other writers need no files."""
    anchors = slugs(cases)
    counts = status_counts(cases)
    bad = sum(counts.get(status, 0) for status in ("FAIL", "ERROR", "TIMEOUT"))
    title = f"Parity report: {len(cases)} cases, {bad} failing"
    body = "".join([
        f"<header><h1>Parity report</h1><p class=\"sub\">{_run_line(header, cases)}</p></header>",
        _mismatch_banner(header),
        _environment(header, cases),
        _counts(counts),
        _filters(cases),
        _matrix(cases, anchors),
        _flat_table(cases, anchors),
        "<section id=\"details\"><h2>Case details</h2>",
        # A SKIP has nothing to detail beyond its reason (in the table and the tooltip): a full plan's thousands of
        # SKIP rows would otherwise make most of the page.
        "".join(section(case, slug) for case, slug in zip(cases, anchors, strict=True) if case["status"] != "SKIP"),
        "</section>",
    ])
    return page(title, body, JS)


def _run_line(header: dict[str, Any], cases: list[dict[str, Any]]) -> str:
    parts = [f"{len(cases)} cases"]
    if header.get("started"):
        parts.append(f"started {escape(str(header['started']))}")
    if header.get("wall_s") is not None:
        parts.append(f"wall {escape(plain(header['wall_s'], '.1f'))} s")
    if header.get("launches") is not None:
        parts.append(f"{escape(str(header['launches']))} launches")
    return " \u00b7 ".join(parts)


def _mismatch_banner(header: dict[str, Any]) -> str:
    """A reference from another diffusers makes every verdict suspect, so it heads the page."""
    text = str(header.get("version_mismatch") or "").strip()
    if not text:
        return ""
    return f'<div class="banner" role="alert">\u26a0 Reference mismatch: {escape(text)}</div>'


def _environment(header: dict[str, Any], cases: list[dict[str, Any]]) -> str:
    env = header.get("environment") or {}
    ref = header.get("reference_environment") or {}
    rows = []
    for key in ENV_KEYS:
        here, there = env.get(key), ref.get(key)
        differs = bool(ref) and key != "device" and there != here
        rows.append(f"<tr{DIFFERS if differs else ''}><th scope=\"row\">{escape(key)}</th>"
                    f"<td>{escape(_text(here))}</td><td>{escape(_text(there))}</td></tr>")
    sizes = ", ".join(str(size) for size in sorted({int(c.get("world_size") or 1) for c in cases}))
    rows.append(f'<tr><th scope="row">world sizes</th><td>{escape(sizes or "-")}</td><td></td></tr>')
    return (
        '<section id="environment"><h2>Environment</h2>'
        f'<p class="env-note">{escape(_reference_note(header))}</p>'
        '<table class="env"><thead><tr><th></th><th scope="col">this run</th><th scope="col">references</th></tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>{_settings(header.get('settings'))}</section>"
    )


def _reference_note(header: dict[str, Any]) -> str:
    ref = header.get("reference_environment") or {}
    if header.get("version_mismatch"):
        return "References were captured with a different diffusers (see the warning above)."
    if not ref:
        return "No reference metadata was recorded."
    return f"References were captured with the same diffusers version ({_text(ref.get('diffusers'))})."


def _text(value: Any) -> str:
    return "\u2014" if value is None or value == "" else str(value)


def _settings(settings: Any) -> str:
    if not isinstance(settings, dict) or not settings:
        return ""
    rows = "".join(f'<tr><th scope="row">{escape(str(k))}</th><td>{escape(_text(v))}</td></tr>'
                   for k, v in settings.items())
    return f'<details class="settings"><summary>Settings</summary><table class="env">{rows}</table></details>'


def _counts(counts: dict[str, int]) -> str:
    """Per-status totals; each is a button that filters to that status."""
    buttons = "".join(
        f'<button type="button" class="count s-{escape(status)}" data-set-status="{escape(status)}" '
        f'title="show only {escape(status)}"><b>{count}</b>{escape(status)}</button>'
        for status, count in counts.items() if count or status in ("PASS", "FAIL")
    )
    return f'<section id="summary"><h2>Results</h2><div class="counts">{buttons}</div></section>'


def _filters(cases: list[dict[str, Any]]) -> str:
    """Real form controls, so the filters work from the keyboard and with screen readers."""
    selects = []
    for key in FILTER_KEYS:
        values = unique(c[key] for c in cases)
        if key == "status":
            values = [s for s in STATUSES if s in values] + [v for v in values if v not in STATUSES]
        options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in values)
        selects.append(f'<label>{key} <select name="{key}"><option value="">all</option>{options}</select></label>')
    return (
        '<form id="filters" role="search" aria-label="filter cases">'
        + "".join(selects)
        + '<label><input type="checkbox" name="failures"> failures only</label>'
        '<button type="reset">clear</button>'
        '<span id="shown-count" aria-live="polite">'
        f'{len(cases)} cases</span><span class="nojs muted">(filters need JavaScript)</span></form>'
    )


def _matrix(cases: list[dict[str, Any]], anchors: list[str]) -> str:
    """Rows model x shape x dtype (x kind when mixed), columns layout x backend; one link per case."""
    if not cases:
        return '<section id="matrix"><h2>Matrix</h2><p class="none">No cases in this run.</p></section>'
    with_kind = any(c["kind"] != "tensor" for c in cases)
    columns = unique((c["layout"], c["backend"]) for c in cases)
    rows = unique(row_label(c, with_kind) for c in cases)
    grid: dict[tuple[str, tuple[str, str]], list[str]] = {}
    for case, slug in zip(cases, anchors, strict=True):
        grid.setdefault((row_label(case, with_kind), (case["layout"], case["backend"])), []).append(_cell(case, slug))
    head = "".join(
        f'<th scope="col" data-col="{i}"><span class="layout">{escape(layout)}</span>'
        f'<span class="backend">{escape(backend)}</span></th>' for i, (layout, backend) in enumerate(columns)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td data-col="{i}"{"" if (row, col) in grid else EMPTY}>{"".join(grid.get((row, col), []))}</td>'
            for i, col in enumerate(columns)
        )
        body.append(f'<tr class="mrow"><th scope="row">{escape(row)}</th>{cells}</tr>')
    legend = "".join(badge(s) for s in STATUSES)
    corner = "model dtype kind" if with_kind else "model dtype"
    return (
        f'<section id="matrix"><h2>Matrix</h2><div class="legend">{legend}'
        '<span class="muted">cell: status, then max abs error (SSIM for image cases); hover for the reason, '
        'click or Enter for details, arrow keys move between cells</span></div>'
        f'<div class="scroll"><table class="matrix"><thead><tr><th scope="col">{corner}</th>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table></div>'
        '<p class="none no-match" hidden>No case matches the filters.</p></section>'
    )


def _cell(case: dict[str, Any], slug: str) -> str:
    tooltip = case["reason"] or f"{case['case_id']}: {case['status']}"
    number = key_number(case)
    return (
        f'<a class="cell-case filterable s-{escape(case["status"])}" href="#{escape(slug)}" '
        f'title="{escape(tooltip)}" {data_attrs(case)}><b>{escape(case["status"])}</b>'
        f'<span class="num">{escape(number) or "&nbsp;"}</span></a>'
    )


def _flat_table(cases: list[dict[str, Any]], anchors: list[str]) -> str:
    """Every case in one table: easy to scan, search with Ctrl+F, and copy into an issue."""
    head = ("case", "status", "max abs", "tolerance", "mean abs", "max rel", "err ratio", "SSIM", "seconds", "reason")
    rows = []
    for case, slug in zip(cases, anchors, strict=True):
        nums = [short(case.get(k)) or DASH for k in ("max_abs_err", "tolerance", "mean_abs_err", "max_rel_err")]
        nums += [plain(case.get("err_ratio"), ".3g"), plain(case["extra"].get("ssim"), ".4f"),
                 plain(case.get("seconds"), ".3g")]
        rows.append(
            f'<tr class="case-row filterable" {data_attrs(case)}>'
            f'<td><a class="case-link" href="#{escape(slug)}"><code>{escape(case["case_id"])}</code></a></td>'
            f'<td>{badge(case["status"])}</td>'
            + "".join(f'<td class="n">{escape(n or "")}</td>' for n in nums)
            + f'<td><div class="reason-cell">{escape(case["reason"])}</div></td></tr>'
        )
    header = "".join(f'<th scope="col">{escape(h)}</th>' for h in head)
    return (
        f'<section id="cases"><h2>All cases</h2><div class="scroll"><table class="cases"><thead><tr>{header}</tr>'
        f'</thead><tbody>{"".join(rows)}</tbody></table></div></section>'
    )
