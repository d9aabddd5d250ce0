"""`index.html`: one self-contained page rendered from results.json, readable offline, in CI artifacts and on paper.

It stays light on a full plan (22,800 cases): the records are embedded once as compact JSON (embed.py) and the page
script (static/*.js) draws a case's detail only when it is opened, and a model's matrix only when its section is
opened. The HTML itself holds what a reviewer reads first: the environment in one line, the counts, the failing
cases with their reasons, and the other cases summarised by reason (sections.py). The filters and the matrix follow
the axes (axes.py), the status order `Status`'s, and the matrix's legend names the figure each cell writes, from the
figures the cases carry. Everything is read through the typed records (`RunHeader`, `CaseResult`).
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from harness.core.header import RunHeader
from harness.core.results import RESULTS_FILE, CaseResult, Status, read_results
from harness.report import axes
from harness.report.assets import page
from harness.report.changes import base_or_none, changes
from harness.report.coverage import coverage_section
from harness.report.data import BAD, ordered_statuses, plain, status_counts, unique
from harness.report.embed import encode, script_tag
from harness.report.first_screen import no_coverage, setup_line, stands_on, verdict
from harness.report.history import changed_groups, changes_line, changes_section
from harness.report.matrix_section import matrix_section
from harness.report.moved import moved_banner
from harness.report.sections import Lists, attention_section, group_section, issue_list, split

__all__ = ["render_html", "render_page"]

ALWAYS_COUNTED = (Status.PASS.value, Status.FAIL.value)  # a count button even at 0: a run with none says so
ENV_KEYS = ("torch", "diffusers", "diffusers_commit", "python", "device")  # the environment's rows, in this order
SCRIPTS = ("format.js", "charts.js", "detail.js", "matrix.js", "place.js", "report.js")  # static/, in this order
# What a page is for, from `RunHeader.purpose` (harness.run.selftest sets "selftest"): a banner on how to read it.
PURPOSES = {"selftest": "Selftest page: every case here carries a deliberate bug (a negative control), so FAIL is the "
                        "expected outcome; a PASS or an XPASS means a bug went unnoticed."}
DIFFERS = ' class="differs"'
NAV = (("failing", "Needs a look"), ("known-issues", "Known issues and refusals"), ("skipped", "Skipped"),
       ("not-applicable", "Not applicable"), ("passing", "Passing"), ("matrix", "Matrix"), ("details", "Opened cases"),
       ("environment", "Environment"))


def render_html(report_dir: Path, base: Path | str | None = None) -> Path:
    """Write `report_dir/index.html` from `report_dir/results.json`; images are linked relative to that folder.
    `base`: a base run's report folder to mark what changed against (default: the run's own `--compare-with`)."""
    report_dir = Path(report_dir)
    header, cases = read_results(report_dir / RESULTS_FILE)
    out = report_dir / "index.html"
    tmp = out.with_suffix(".html.tmp")
    settings = header.settings if isinstance(header.settings, dict) else {}
    tmp.write_text(render_page(header, cases, base or settings.get("compare_with") or None), encoding="utf-8")
    tmp.replace(out)
    return out


def render_page(header: RunHeader, cases: list[CaseResult], base: Path | str | None = None) -> str:
    """The whole document as a string, so tests and other writers need no files; with a `base` run's folder, what
    changed against it marked per cell and listed (changes.py)."""
    counts = status_counts(cases)
    lists = split(cases)
    base_cases, unread = base_or_none(base)
    changed = changes(base_cases, cases) if base_cases is not None else {}
    bad = sum(counts.get(status, 0) for status in BAD)
    title = f"Parity report: {len(cases)} cases, {bad} failing"
    body = "".join([
        f"<header><h1>Parity report {verdict(header, counts)}</h1>{stands_on(cases)}"
        f"<p class=\"sub\">{_run_line(header, cases)}</p>"
        f"{_environment_line(header)}{setup_line(header, cases)}{_time(header)}{_nav()}</header>",
        _incomplete_banner(header),
        _mismatch_banner(header),
        moved_banner(cases),
        _purpose_banner(header),
        changes_line(base, changed, unread) if base else "",
        _counts(counts),
        _filters(cases),
        '<noscript><p class="banner">The matrix and the case details are drawn by this page\'s script: with '
        "JavaScript off, the lists below and matrix.csv beside this file still hold every case.</p></noscript>",
        attention_section(cases, lists.attention),
        changes_section(cases, changed) if base_cases is not None else "",
        '<section id="details" hidden><h2>Opened cases</h2><div id="opened"></div></section>',
        _lists(lists, cases, header),
        matrix_section(cases, header.values_help),
        coverage_section(header) or no_coverage(),
        _environment(header, cases),
        script_tag(encode(cases, {**lists.groups(), **changed_groups(changed)}, header.values_help,
                          {"changes": changed, "base": str(base or "")})),
    ])
    return page(title, body, SCRIPTS)


def _nav() -> str:
    links = " \u00b7 ".join(f'<a href="#{key}">{escape(label)}</a>' for key, label in NAV)
    return f'<nav class="jump" aria-label="sections">{links}</nav>'


def _lists(lists: Lists, cases: list[CaseResult], header: RunHeader) -> str:
    listing = issue_list(cases, list(header.known_issues_unmatched or []))
    return (group_section("known-issues", "Known issues (XFAIL) and expected refusals (REFUSED), most severe first",
                          lists.xfail, cases, "issue", "XFAIL", listing)
            + group_section("skipped", "Skipped", lists.skip, cases, "reason", "SKIP")
            + group_section("not-applicable", "Not applicable (N/A)", lists.not_applicable, cases, "reason", "N/A")
            + group_section("passing", "Passing", lists.passing, cases, "group", "PASS"))


def _run_line(header: RunHeader, cases: list[CaseResult]) -> str:
    parts = [f"{len(cases)} cases"]
    if header.started:
        parts.append(f"started {escape(str(header.started))}")
    if header.wall_s:
        parts.append(f"wall {escape(plain(header.wall_s, '.1f'))} s")
    if header.launches:
        parts.append(f"{escape(str(header.launches))} launches")
    return " \u00b7 ".join(parts)


def _environment_line(header: RunHeader) -> str:
    """What ran, in the first screen: torch, diffusers, python and the device, and whether the references came from
    the same diffusers (the Environment section at the end compares every row and holds the settings)."""
    env = header.environment or {}
    parts = [f"<b>{escape(key)}</b> {escape(_env_text(key, env.get(key)))}" for key in ENV_KEYS
             if env.get(key) or key == "diffusers_commit" and env.get("diffusers")]
    if not parts:
        return ""
    parts.append(f'<a href="#environment">{escape(_reference_short(header))}</a>')
    return f'<p class="env-line" id="env-line">{" &middot; ".join(parts)}</p>'


def _time(header: RunHeader) -> str:
    """Where the wall time went (launch start-ups, each phase of the cases on rank 0), against the run's floor."""
    breakdown = header.time_breakdown or {}
    if not breakdown:
        return ""
    rows = "".join(f'<tr><th scope="row">{escape(name)}</th><td>{escape(plain(value, ".1f"))} s</td></tr>'
                   for name, value in breakdown.items() if name != "ratio to floor" and value is not None)
    ratio = breakdown.get("ratio to floor")
    summary = (f"Time: {plain(breakdown.get('wall'), '.0f')} s, {ratio} times the least this plan could take "
               "(its launch start-ups and the cases' own time)") if ratio else "Time"
    return (f'<details class="settings"><summary>{escape(summary)}</summary><table class="env">{rows}</table>'
            "<p class=\"muted\">floor: launch start-ups plus the cases' own time (each case's run carries the proof's "
            "recording, and an eager case runs a second time for the repeat check); the reports are written after "
            "this page is (results.json has their time)</p></details>")


def _incomplete_banner(header: RunHeader) -> str:
    """A run that stopped before its end: what is here is what finished, and the rest is ERROR "not run"."""
    text = str(header.incomplete or "").strip()
    if not text:
        return ""
    return (f'<div class="banner" role="alert">\u26a0 Incomplete run: {escape(text)}. The finished cases are below; '
            "the others are ERROR &ldquo;not run&rdquo;, and <code>harness run --resume</code> runs them.</div>")


def _mismatch_banner(header: RunHeader) -> str:
    """A reference from another diffusers makes every verdict suspect, so it heads the page."""
    text = str(header.version_mismatch or "").strip()
    if not text:
        return ""
    return f'<div class="banner" role="alert">\u26a0 Reference mismatch: {escape(text)}</div>'


def _purpose_banner(header: RunHeader) -> str:
    text = PURPOSES.get(str(header.purpose or ""))
    return f'<div class="banner purpose" role="note">{escape(text)}</div>' if text else ""


def _environment(header: RunHeader, cases: list[CaseResult]) -> str:
    env = header.environment or {}
    ref = header.reference_environment or {}
    rows = []
    for key in ENV_KEYS:
        here, there = env.get(key), ref.get(key)
        differs = bool(ref) and key != "device" and there != here
        rows.append(f"<tr{DIFFERS if differs else ''}><th scope=\"row\">{escape(key)}</th>"
                    f"<td>{escape(_env_text(key, here))}</td><td>{escape(_env_text(key, there))}</td></tr>")
    sizes = ", ".join(str(size) for size in sorted({int(c.world_size or 1) for c in cases}))
    rows.append(f'<tr><th scope="row">world sizes</th><td>{escape(sizes or "-")}</td><td></td></tr>')
    return (
        '<section id="environment"><h2>Environment</h2>'
        f'<p class="env-note">{escape(_reference_note(header))}</p>'
        '<table class="env"><thead><tr><th></th><th scope="col">this run</th><th scope="col">references</th></tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>{_settings(header.settings)}</section>"
    )


def _reference_note(header: RunHeader) -> str:
    ref = header.reference_environment or {}
    if header.version_mismatch:
        return "References were captured with a different diffusers (see the warning above)."
    if not ref:
        return "No reference metadata was recorded."
    return f"References were captured with the same diffusers version ({_text(ref.get('diffusers'))})."


def _reference_short(header: RunHeader) -> str:
    ref = header.reference_environment or {}
    if not ref:
        return "no reference metadata"
    same = "differs, see above" if header.version_mismatch else "the same"
    return f"references: diffusers {_text(ref.get('diffusers'))} ({same})"


def _env_text(key: str, value: Any) -> str:
    """An environment row's value; no diffusers commit means diffusers came from a release wheel."""
    return "release wheel" if key == "diffusers_commit" and value in (None, "") else _text(value)


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
        f'data-total="{count}" title="show only {escape(status)}"><b>{count}</b>{escape(status)}'
        '<span class="of"></span></button>'
        for status, count in counts.items() if count or status in ALWAYS_COUNTED
    )
    return f'<section id="summary"><h2>Results</h2><div class="counts">{buttons}</div></section>'


def _filters(cases: list[CaseResult]) -> str:
    """Real form controls, so the filters work from the keyboard and with screen readers: the status and every axis
    on which the cases differ."""
    selects = [_select("status", ordered_statuses(c.status.value for c in cases))]
    for name in axes.names():
        values = unique(getattr(c, name) for c in cases)
        if len(values) > 1:
            selects.append(_select(name, values))
    return (
        '<form id="filters" role="search" aria-label="filter cases">'
        + "".join(selects)
        + '<label>search <input type="search" name="q" placeholder="case id, reason or known issue" size="26" '
        'title="a part of a case id, of its reason (an error, &quot;expected refusal&quot;, a known issue\'s cause), '
        'or of a known issue\'s title, key or kind"></label>'
        '<label><input type="checkbox" name="failures"> failures only</label>'
        '<label title="matrix rows and columns in which every case is SKIP or N/A"><input type="checkbox" '
        'name="skips"> all-SKIP matrix rows</label>'
        '<button type="reset">clear</button>'
        '<span id="shown-count" aria-live="polite">'
        f'{len(cases)} cases</span><span class="nojs muted">(filters need JavaScript)</span></form>'
    )


def _select(name: str, values: list[str]) -> str:
    options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in values)
    return (f'<label>{escape(name)} <select name="{escape(name)}"><option value="">all</option>{options}</select>'
            "</label>")
