"""Two runs side by side: which cases changed status, as compare.html and as a Markdown table for CI comments."""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any

from harness.report.assets import page
from harness.report.data import BAD, STATUSES, base_slug, load, status_counts

ABSENT = "(absent)"


def compare_runs(old_dir: Path, new_dir: Path, out_dir: Path | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Write `compare.html` (in `out_dir`, default `new_dir`) and return it with the status changes.

    A change is {case_id, old, new, old_reason, new_reason}; `old`/`new` is None for a case only in one run.
    """
    old_dir, new_dir = Path(old_dir), Path(new_dir)
    out_dir = Path(out_dir) if out_dir is not None else new_dir
    old_header, old_cases = load(old_dir)
    new_header, new_cases = load(new_dir)
    changes = status_changes(old_cases, new_cases)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "compare.html"
    runs = {"old": (old_dir, old_header, old_cases), "new": (new_dir, new_header, new_cases)}
    path.write_text(_compare_page(runs, changes, out_dir), encoding="utf-8")
    return path, changes


def status_changes(old_cases: list[dict[str, Any]], new_cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Changed, added and removed cases; regressions first, then the rest in the new run's order."""
    old = {c["case_id"]: c for c in old_cases}
    new = {c["case_id"]: c for c in new_cases}
    changes = []
    for case_id in dict.fromkeys([*new, *old]):
        before, after = old.get(case_id), new.get(case_id)
        if before and after and before["status"] == after["status"]:
            continue
        changes.append({
            "case_id": case_id,
            "old": before["status"] if before else None,
            "new": after["status"] if after else None,
            "old_reason": before["reason"] if before else "",
            "new_reason": after["reason"] if after else "",
        })
    return sorted(changes, key=lambda change: 0 if is_regression(change) else 1)


def is_regression(change: dict[str, Any]) -> bool:
    """Newly bad: a failing status now where there was a non-failing one, or none at all."""
    return change["new"] in BAD and change["old"] not in BAD


def changed_markdown(changes: list[dict[str, Any]]) -> str:
    """A short table for a PR comment or job summary; reasons are cut to one line."""
    if not changes:
        return "No status changes.\n"
    lines = ["| case | old | new | reason |", "|---|---|---|---|"]
    for change in changes:
        reason = change.get("new_reason") or change.get("old_reason") or ""
        marker = " \u26a0" if is_regression(change) else ""
        lines.append(f"| `{change['case_id']}` | {change['old'] or ABSENT} | {change['new'] or ABSENT}{marker} "
                     f"| {_one_line(reason)} |")
    return "\n".join(lines) + "\n"


def _one_line(text: str, limit: int = 140) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _compare_page(runs: dict[str, tuple], changes: list[dict[str, Any]], out_dir: Path) -> str:
    regressions = sum(is_regression(c) for c in changes)
    title = f"Parity comparison: {len(changes)} changed, {regressions} newly failing"
    summary = "".join(_run_row(name, *run, out_dir) for name, run in runs.items())
    new_index = runs["new"][0] / "index.html"
    index = _relative(new_index, out_dir) if new_index.exists() else None
    rows = "".join(_change_row(change, index) for change in changes)
    table = (
        '<table class="cases"><thead><tr><th scope="col">case</th><th scope="col">old</th><th scope="col">new</th>'
        f'<th scope="col">old reason</th><th scope="col">new reason</th></tr></thead><tbody>{rows}</tbody></table>'
        if changes else '<p class="none">No case changed status.</p>'
    )
    heads = "".join(f'<th scope="col">{s}</th>' for s in STATUSES)
    body = (
        f"<header><h1>Parity comparison</h1><p class=\"sub\">{len(changes)} cases changed status, "
        f"{regressions} newly failing (marked \u26a0)</p></header>"
        f'<section><h2>Runs</h2><table class="env"><thead><tr><th scope="col">run</th><th scope="col">folder</th>'
        f'<th scope="col">diffusers</th><th scope="col">started</th>{heads}</tr></thead><tbody>{summary}</tbody>'
        f"</table></section><section><h2>Status changes</h2>{table}</section>"
    )
    return page(title, body)


def _run_row(name: str, folder: Path, header: dict, cases: list, out_dir: Path) -> str:
    counts = status_counts(cases)
    env = header.get("environment") or {}
    link = _relative(folder / "index.html", out_dir)
    label = f'<a href="{escape(link)}">{escape(str(folder))}</a>' if (folder / "index.html").exists() else escape(
        str(folder))
    cells = "".join(f"<td>{counts.get(s, 0)}</td>" for s in STATUSES)
    return (f'<tr><th scope="row">{name}</th><td>{label}</td><td>{escape(str(env.get("diffusers") or ""))}</td>'
            f'<td>{escape(str(header.get("started") or ""))}</td>{cells}</tr>')


def _change_row(change: dict[str, Any], index: str | None) -> str:
    def status(value: str | None) -> str:
        return f'<span class="badge s-{escape(value)}">{escape(value)}</span>' if value else ABSENT

    case = f"<code>{escape(change['case_id'])}</code>"
    if change["new"] is not None and index is not None:
        case = f'<a href="{escape(index)}#{escape(base_slug(change["case_id"]))}">{case}</a>'
    flag = " \u26a0 regression" if is_regression(change) else ""
    return (f"<tr><td>{case}</td><td>{status(change['old'])}</td><td>{status(change['new'])}{flag}</td>"
            f'<td><div class="reason-cell">{escape(change["old_reason"])}</div></td>'
            f'<td><div class="reason-cell">{escape(change["new_reason"])}</div></td></tr>')


def _relative(target: Path, start: Path) -> str:
    """A link that still works when the folders are moved together (CI artifacts)."""
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
