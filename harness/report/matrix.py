"""Results -> text views: one CSV row per case, a short Markdown summary for CI, a terminal matrix.

Each view is sized for where it is read. The full grid with every number is index.html's; the terminal gets one
block per model that fits 120 columns, and matrix.md (a CI step summary) gets counts, a row per model, every failing
case by id, and the other statuses grouped by reason.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from harness.core import axes, figures
from harness.core.records import Case
from harness.core.results import SEVERITIES, CaseResult, Status
from harness.report.data import OBSERVED, anchor, link, standing, standing_text
from harness.report.idsets import describe

# Around the figures, which are each kind's own (a column per figure name, in the kinds' order: harness.core.figures).
_FIRST = ["case_id", "model", "shape", "kind", "layout", "world_size", "backend", "dtype"]
# an axis added later: its column; `severity`: an XFAIL's or REFUSED's kind of finding (CaseResult.severity)
LEADING = [*_FIRST, *(name for name in axes.NAMES if name not in _FIRST), "status", "severity"]
DECIDING = ["deciding", "deciding_margin"]  # the deciding check in words, and how much of its limit it used
TRAILING = ["first_divergence", "dispatched", "kernels", "comms", "reason", "seconds", "peak_mem_mb"]
WIDTH = 120  # terminal columns every line of `terminal()` fits in
_INDEX_MAX, _CELL_MAX = 40, 32  # caps that keep one label plus two cases' cell under WIDTH whatever the names
_REASON_MAX = 300  # Markdown reason cells; the whole text is in index.html
_REASON_LINES = 4  # terminal lines of a failing case's reason


def csv_columns(results: list[CaseResult]) -> list[str]:
    """The leading columns, the deciding check, one per figure any case has, then the trailing ones."""
    return [*LEADING, *DECIDING, *figures.columns(results), *TRAILING]


def to_frame(results: list[CaseResult]) -> pd.DataFrame:
    columns, rows = csv_columns(results), []
    for result in results:
        row = result.to_dict()
        row.update({figure["name"]: row_value(figure) for figure in row["figures"]})
        decided = result.deciding or {}
        row.update(deciding=decided.get("text"), deciding_margin=decided.get("margin"), severity=result.severity)
        rows.append({column: row.get(column) for column in columns})
    return pd.DataFrame(rows, columns=columns)


def row_value(figure: dict):
    """A figure's value in its CSV column (as results.json writes it: NaN and Inf as text)."""
    return figure.get("value")


def counts(results: list[CaseResult]) -> dict[str, int]:
    tally = Counter(result.status.value for result in results)
    return {status.value: tally.get(status.value, 0) for status in Status}


def counts_line(results: list[CaseResult]) -> str:
    return ", ".join(f"{count} {status}" for status, count in counts(results).items() if count)


def write_csv(results: list[CaseResult], path: Path) -> None:
    to_frame(results).to_csv(path, index=False)


def _by(results: Iterable[CaseResult], key: Callable[[CaseResult], str]) -> dict[str, list[CaseResult]]:
    """Groups in order of first appearance, which is the plan's order."""
    groups: dict[str, list[CaseResult]] = {}
    for result in results:
        groups.setdefault(key(result), []).append(result)
    return groups


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


_DEFAULT_KIND = Case.__dataclass_fields__["kind"].default  # the kind a column leaves unsaid

def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# -- terminal ---------------------------------------------------------------------------------------------------


def _cell(result: CaseResult) -> str:
    label = result.status.value
    if result.status in (Status.PASS, Status.FAIL, Status.XFAIL, Status.XPASS) and result.cell:
        label += f" {result.cell}"
    return _clip(label, _CELL_MAX)


_IN_ROW = ("load", "flow")  # axes a block writes in its rows (under their layout's), as the page's matrix does


def _column(result: CaseResult) -> str:
    """A block's column: what is left of the case id once model, layout, backend and flow are known (the id's last
    part keeps a negative control's `+fault`, so two cases never share a cell)."""
    shape = "" if result.shape == "default" else f"@{result.shape} "
    fault = result.case_id.rsplit("/", 1)[-1].partition(axes.FAULT)[2]
    later = [axis for axis in axes.AXES[axes.NAMES.index("kind"):] if axis.name not in _IN_ROW]  # the kind and after
    parts = [str(getattr(result, axis.name)) for axis in later
             if getattr(result, axis.name) not in (axis.default, _DEFAULT_KIND) or (fault and axis.name == "kind")]
    tail = " ".join(parts) + (f"{axes.FAULT}{fault}" if fault else "")
    return _clip(f"{shape}{result.dtype}" + (f" {tail}" if tail else ""), _CELL_MAX)


def _row(result: CaseResult) -> str:
    """A block's row: layout/backend, and a load or flow other than the default after it (a row under its
    layout's)."""
    extra = [str(getattr(result, name)) for name in _IN_ROW
             if getattr(result, name) != axes.AXES[axes.NAMES.index(name)].default]
    return _clip(" ".join([f"{result.layout}/{result.backend}", *extra]), _INDEX_MAX)


def terminal(results: list[CaseResult], width: int = WIDTH, page: str | None = None) -> str:
    """One block per model (rows layout/backend, columns dtype and kind), columns wrapped to `width`; then every
    failing case with its reason (wrapped) and, given the report `page`, the link that opens it there; then the
    counts. SKIP and N/A cases stay out of the grid unless nothing else ran."""
    shown = [r for r in results if r.status.ran] or results
    lines: list[str] = []
    everything = _by(results, lambda r: r.model)
    for model, group in _by(shown, lambda r: r.model).items():
        lines += _block(f"{model}: {counts_line(everything[model])}", group, width)
    failing = [r for r in results if r.status.needs_a_look]
    if failing:
        lines.append(f"failing ({len(failing)}):")
        for r in failing:
            lines += _failing(r, width, page)
        lines.append("")
    lines.append(counts_line(results) or "(no cases)")
    if results:
        lines += textwrap.wrap(stands_on(results), width, subsequent_indent="  ")
    return "\n".join(lines)


def stands_on(results: list[CaseResult]) -> str:
    """The verdict and what it stands on: `PASS stands on: 0 new failures; 20 known silently wrong results in
    diffusers, ...` (report.data.standing)."""
    counts = standing(results)
    return f"{'FAIL' if counts['failures'] else 'PASS'} stands on: {standing_text(counts)}"


def _failing(result: CaseResult, width: int, page: str | None) -> list[str]:
    """A failing case: status, id and reason wrapped within `width` (at most _REASON_LINES lines, the whole reason is
    the page's), its first divergence, and the link that opens it on the page."""
    head, indent = f"  {result.status.value:7s} {result.case_id}", " " * 10
    reason = _one_line(result.reason)
    if len(head) + 2 + min(len(reason), 20) > width:  # a long id: the reason starts on the next line
        lines, first = [_clip(head, width)], indent
    else:
        lines, first = [], head + "  "
    lines += textwrap.wrap(reason, width, initial_indent=first, subsequent_indent=indent, max_lines=_REASON_LINES,
                           placeholder=" [...]", break_long_words=True, break_on_hyphens=False) or [head]
    if result.first_divergence:
        lines.append(_clip(f"{indent}first divergence: {result.first_divergence}", width))
    if result.extra.get("repro"):
        lines.append(_clip(f"{indent}reproduce alone: {result.extra['repro']}", width))
    if page:
        url = link(page, result.case_id)
        lines.append(f"{indent}{url}" if len(indent) + len(url) <= width else _clip(f"{indent}#{anchor(result.case_id)}"
                                                                                     f" in {page}", width))
    return lines


def _block(title: str, group: list[CaseResult], width: int) -> list[str]:
    rows = list(dict.fromkeys(_row(r) for r in group))
    columns = list(dict.fromkeys(_column(r) for r in group))
    cells: dict[tuple[str, str], str] = {}
    for r in group:  # two cases in one cell (ids that differ only past the cut) are both shown
        key = (_row(r), _column(r))
        cells[key] = _clip(f"{cells[key]}, {_cell(r)}", 2 * _CELL_MAX) if key in cells else _cell(r)
    index_w = max(len("layout/backend"), *(len(row) for row in rows))
    widths = {c: max(len(c), *(len(cells.get((row, c), "")) for row in rows)) for c in columns}
    chunks, chunk, used = [], [], index_w
    for column in columns:
        if chunk and used + 2 + widths[column] > width:
            chunks.append(chunk)
            chunk, used = [], index_w
        chunk.append(column)
        used += 2 + widths[column]
    chunks.append(chunk)
    lines = []
    for part, chunk in enumerate(chunks):
        more = f" (columns {part + 1} of {len(chunks)})" if len(chunks) > 1 else ""
        lines.append(_clip(f"{title}{more}", width))
        lines.append("  ".join(["layout/backend".ljust(index_w), *(c.ljust(widths[c]) for c in chunk)]).rstrip())
        for row in rows:  # a row with no case in these columns (a flow's, in another kind's) says nothing here
            values = [cells.get((row, c), "").ljust(widths[c]) for c in chunk]
            if any(value.strip() for value in values):
                lines.append("  ".join([row.ljust(index_w), *values]).rstrip())
        lines.append("")
    return lines


# -- Markdown ---------------------------------------------------------------------------------------------------


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _md(text: str, limit: int = _REASON_MAX) -> str:
    return _escape(_clip(_one_line(text), limit))


def _grouped_table(title: str, results: list[CaseResult], key: Callable[[CaseResult], str],
                   severity: bool = False) -> list[str]:
    """One row per distinct reason: how many cases, the reason, and which cases as exact brace patterns; with
    `severity`, each known issue's kind of finding first and the most severe kind first (SEVERITIES)."""
    if not results:
        return []
    head = ["| cases | kind | reason | which |", "|---:|---|---|---|"] if severity else \
        ["| cases | reason | which |", "|---:|---|---|"]
    lines = ["", f"### {title} ({len(results)})", "", *head]
    groups = sorted(_by(results, key).items(), key=lambda item: (
        SEVERITIES.index(item[1][0].severity) if severity else 0, -len(item[1])))
    for reason, group in groups:
        kind = f"{group[0].severity} | " if severity else ""
        lines.append(f"| {len(group)} | {kind}{_md(reason or '(no reason given)')} | "
                     f"{_escape(describe((r.case_id for r in group), 240))} |")
    return lines


def _known_issue(result: CaseResult) -> str:
    """The known issue an XFAIL matched, without the observed error text that differs case by case."""
    return result.reason.split(OBSERVED, 1)[0]


def markdown(results: list[CaseResult], header_lines: list[str] = ()) -> str:
    """Counts, what they stand on, a row per model, every FAIL/ERROR/TIMEOUT by id, the rest grouped by reason, and
    where to look."""
    lines = ["## Parity matrix", "", *header_lines, f"**{counts_line(results) or 'no cases'}**"]
    if results:
        lines += ["", stands_on(results)]
    statuses = [status for status, count in counts(results).items() if count]
    if results:
        lines += ["", "| model | cases | " + " | ".join(statuses) + " |", "|---|" + "---:|" * (len(statuses) + 1)]
        for model, group in _by(results, lambda r: r.model).items():
            tally = counts(group)
            row = [_mark(status, tally[status]) for status in statuses]
            lines.append(f"| {_md(model, 60)} | {len(group)} | " + " | ".join(row) + " |")
    failing = [r for r in results if r.status.needs_a_look]
    if failing:
        lines += ["", f"### Failing ({len(failing)})", "", "| case | status | deciding check | reason | "
                  "first divergence |", "|---|---|---|---|---|"]
        lines += [f"| `{r.case_id}` | **{r.status.value}** | {_md((r.deciding or {}).get('text', ''))} | "
                  f"{_md(r.reason)} | {_md(r.first_divergence or '')} |" for r in failing]
    lines += _grouped_table("Known issues (XFAIL) and expected refusals (REFUSED), most severe first",
                            [r for r in results if r.severity], _known_issue, severity=True)
    lines += _grouped_table("Passing with a note", [r for r in results if r.status is Status.PASS and r.reason],
                            lambda r: r.reason)
    lines += _grouped_table("Skipped, by reason", [r for r in results if r.status is Status.SKIP],
                            lambda r: r.reason)
    lines += _grouped_table("Not applicable (N/A: the combination cannot exist), by reason",
                            [r for r in results if r.status is Status.NOT_APPLICABLE], lambda r: r.reason)
    lines += ["", "Every case with its numbers, errors, tracebacks, kernels and images: `index.html` beside this "
              "file; one row per case: `matrix.csv`."]
    return "\n".join(lines) + "\n"


def _mark(status: str, count: int) -> str:
    return f"**{count}**" if count and Status(status).is_bad else str(count)
