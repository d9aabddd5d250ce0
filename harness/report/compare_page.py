"""compare.html: the two runs' counts, the regressions one by one, and everything else summarised.

Two full plans can differ in thousands of cases (a GPU run against a CPU one), so only what gates CI is listed row by
row in the HTML: the regressions and the failing cases only in NEW. The other status changes are grouped by
transition (`PASS -> SKIP`: count and exact id patterns) and the cases in one run only are counted and patterned;
their rows are embedded once as compact JSON and drawn by a small script when a group is opened.
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any

from harness.core.errors import HarnessError
from harness.core.header import RunHeader
from harness.core.results import RESULTS_FILE, CaseResult, read_results
from harness.report.assets import page
from harness.report.compare import WARN, Comparison, is_regression, status_changes, status_tally
from harness.report.data import ANCHOR, BAD, STATUSES, link, status_counts
from harness.report.embed import Table, script_tag
from harness.report.html import render_html
from harness.report.sections import patterns

_HEAD = '<th scope="col">{}</th>'


class Lists:
    """Rows for the script: each list is [[case id, status, ..., reason, ...] as string-table indices]."""

    def __init__(self) -> None:
        self.strings = Table()
        self.lists: dict[str, list[list[int]]] = {}

    def add(self, key: str, rows: list[tuple[str, ...]]) -> str:
        self.lists[key] = [[self.strings.index(value) for value in row] for row in rows]
        return key

    def data(self, index: str | None) -> dict[str, Any]:
        return {"s": self.strings.values, "lists": self.lists, "index": index, "anchor": ANCHOR}


def compare_runs(old_dir: Path, new_dir: Path, out_dir: Path | None = None) -> Comparison:
    """Compare `old_dir/results.json` with `new_dir/results.json` and write `compare.html` into `out_dir` (default
    `new_dir`). Both files are read before anything is written; a missing or unreadable one is a HarnessError.
    NEW's index.html, which the page links into, is rendered (marking what changed against OLD) when it is missing
    or when compare.html goes beside it."""
    old_dir, new_dir = Path(old_dir), Path(new_dir)
    out_dir = Path(out_dir) if out_dir is not None else new_dir
    old_header, old_cases = _load(old_dir, "OLD")
    new_header, new_cases = _load(new_dir, "NEW")
    comparison = status_changes(old_cases, new_cases)
    if out_dir == new_dir or not (new_dir / "index.html").exists():
        comparison.wrote.append(render_html(new_dir, base=old_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    comparison.page = out_dir / "compare.html"
    runs = {"old": (old_dir, old_header, old_cases), "new": (new_dir, new_header, new_cases)}
    comparison.page.write_text(compare_page(runs, comparison, out_dir), encoding="utf-8")
    comparison.wrote.append(comparison.page)
    return comparison


def _load(folder: Path, which: str) -> tuple[RunHeader, list[CaseResult]]:
    try:
        return read_results(folder / RESULTS_FILE)
    except HarnessError as error:
        raise HarnessError(f"{which} run ({folder}): {error}") from error


def compare_page(runs: dict[str, tuple], comparison: Comparison, out_dir: Path) -> str:
    summary = "".join(_run_row(name.upper(), *run, out_dir) for name, run in runs.items())
    new_index = runs["new"][0] / "index.html"
    index = _relative(new_index, out_dir) if new_index.exists() else None
    lists = Lists()
    heads = "".join(_HEAD.format(s) for s in STATUSES)
    body = (
        f"<header><h1>Parity comparison</h1><p class=\"sub\">{escape(comparison.summary())}; "
        f"regressions are marked {WARN}</p></header>"
        f'<section><h2>Runs</h2><table class="env"><thead><tr><th scope="col">run</th><th scope="col">folder</th>'
        f'<th scope="col">diffusers</th><th scope="col">started</th>{heads}</tr></thead><tbody>{summary}</tbody>'
        f"</table></section>"
        f"<section><h2>Changed status ({len(comparison.changed)})</h2>{_changed(comparison, index, lists)}</section>"
        f"{_only('NEW', comparison.only_new, index, lists)}{_only('OLD', comparison.only_old, None, lists)}"
        f"{script_tag(lists.data(index), 'compare-data')}"
    )
    title = f"Parity comparison: {comparison.summary()}"
    return page(title, body, ("compare.js",))


def _changed(comparison: Comparison, index: str | None, lists: Lists) -> str:
    """Regressions one row each; every other change in a closed group per transition, rows drawn on opening."""
    if not comparison.changed:
        return '<p class="none">No case in both runs changed status.</p>'
    regressions = [change for change in comparison.changed if is_regression(change)]
    out = ""
    if regressions:
        rows = "".join(_change_row(change, index) for change in regressions)
        out += (f"<h3>Regressions ({len(regressions)})</h3><table class=\"cases\"><thead><tr>{_change_heads()}</tr>"
                f"</thead><tbody>{rows}</tbody></table>")
    transitions: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for change in comparison.changed:
        if not is_regression(change):
            transitions.setdefault((change["old"], change["new"]), []).append(change)
    if transitions:
        out += f"<h3>Other changes, by transition ({len(comparison.changed) - len(regressions)})</h3>"
    for (old, new), changes in sorted(transitions.items(), key=lambda item: -len(item[1])):
        key = lists.add(f"t-{old}-{new}", [(c["case_id"], c["old"], c["new"], c["old_reason"], c["new_reason"])
                                           for c in changes])
        title = f"{_badge(old)} \u2192 {_badge(new)}"
        out += _lazy_group(key, len(changes), title, [c["case_id"] for c in changes], "change")
    return out


def _change_heads() -> str:
    return "".join(_HEAD.format(h) for h in ("case", "old", "new", "old reason", "new reason"))


def _lazy_group(key: str, count: int, title: str, case_ids: list[str], kind: str) -> str:
    """A closed group: count, title, exact id patterns; the script fills `.rows` from the list `key`."""
    return (f'<details class="group lazy" data-list="{escape(key)}" data-kind="{kind}"><summary><b class="n">{count}'
            f'</b> <span class="why">{title}</span></summary><div class="group-body">{patterns(case_ids)}'
            '<div class="rows"></div></div></details>')


def _only(name: str, cases: list[dict[str, Any]], index: str | None, lists: Lists) -> str:
    """Counts and patterns in view; failing cases of NEW in view one by one; every id in a closed group whose rows
    the script draws when it is opened."""
    if not cases:
        return f'<section><h2>Only in {name} (0)</h2><p class="none">None.</p></section>'
    failing = [case for case in cases if case["status"] in BAD] if name == "NEW" else []
    flagged = ""
    if failing:
        rows = "".join(_case_row(case, index, f" {WARN} regression") for case in failing)
        flagged = (f"<h3>Failing, only in NEW ({len(failing)})</h3><table class=\"cases\"><tbody>{rows}</tbody>"
                   "</table>")
    key = lists.add(f"only-{name}", [(c["case_id"], c["status"], c["reason"]) for c in cases])
    every = _lazy_group(key, len(cases), f"every case only in {name}", [c["case_id"] for c in cases], "case")
    return (f"<section><h2>Only in {name} ({len(cases)}: {escape(status_tally(cases))})</h2>{flagged}{every}"
            "</section>")


def _badge(value: str) -> str:
    return f'<span class="badge s-{escape(value)}">{escape(value)}</span>'


def _link(case_id: str, index: str | None) -> str:
    case = f"<code>{escape(case_id)}</code>"
    return f'<a href="{escape(link(index, case_id))}">{case}</a>' if index else case


def _case_row(case: dict[str, Any], index: str | None, flag: str) -> str:
    return (f"<tr><td>{_link(case['case_id'], index)}</td><td>{_badge(case['status'])}{flag}</td>"
            f'<td><div class="reason-cell">{escape(case["reason"])}</div></td></tr>')


def _run_row(name: str, folder: Path, header: RunHeader, cases: list[CaseResult], out_dir: Path) -> str:
    counts = status_counts(cases)
    env = header.environment or {}
    index = folder / "index.html"
    label = escape(str(folder))
    if index.exists():
        label = f'<a href="{escape(_relative(index, out_dir))}">{label}</a>'
    cells = "".join(f"<td>{counts.get(s, 0)}</td>" for s in STATUSES)
    return (f'<tr><th scope="row">{name}</th><td>{label}</td><td>{escape(str(env.get("diffusers") or ""))}</td>'
            f"<td>{escape(str(header.started or ''))}</td>{cells}</tr>")


def _change_row(change: dict[str, Any], index: str | None) -> str:
    flag = f" {WARN} regression" if is_regression(change) else ""
    return (f"<tr><td>{_link(change['case_id'], index)}</td><td>{_badge(change['old'])}</td>"
            f"<td>{_badge(change['new'])}{flag}</td>"
            f'<td><div class="reason-cell">{escape(change["old_reason"])}</div></td>'
            f'<td><div class="reason-cell">{escape(change["new_reason"])}</div></td></tr>')


def _relative(target: Path, start: Path) -> str:
    """A link that still works when the folders are moved together (CI artifacts)."""
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
