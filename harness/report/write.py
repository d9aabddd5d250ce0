"""Every view of a run, written from its results and header: results.json, matrix.csv, matrix.md (also appended to
`$GITHUB_STEP_SUMMARY` when set) and index.html."""

from __future__ import annotations

import os
from pathlib import Path

from harness.core.header import RunHeader
from harness.core.results import RESULTS_FILE, CaseResult, write_results
from harness.report import matrix
from harness.report.coverage import summary_line
from harness.report.html import render_html
from harness.report.sections import split_unmatched


def write_reports(report_dir: Path, results: list[CaseResult], header: RunHeader) -> None:
    write_results(report_dir / RESULTS_FILE, results, header)
    matrix.write_csv(results, report_dir / "matrix.csv")
    env = header.environment
    lines = [f"diffusers {env.get('diffusers')}, torch {env.get('torch')}, {env.get('device')}", ""]
    if header.incomplete:
        lines += [f"> **Incomplete run**: {header.incomplete}; the cases not run are ERROR, `harness run --resume` "
                  "runs them", ""]
    if header.version_mismatch:
        lines += [f"> {header.version_mismatch}", ""]
    if covered := summary_line(header):
        lines += [f"Coverage: {covered} (`index.html#coverage`)", ""]
    text = matrix.markdown(results, lines) + _unmatched_markdown(header.known_issues_unmatched)
    (report_dir / "matrix.md").write_text(text)
    render_html(report_dir)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as handle:
            handle.write(text)


def _unmatched_markdown(unmatched: list[str]) -> str:
    """As pytest lists the xfails nothing hit: the known-issue entries that matched no case of the run."""
    if not unmatched:
        return ""
    rows = "".join(f"| {key} | `{match}` |\n" for key, match in map(split_unmatched, unmatched))
    return (f"\n### Known-issue entries that matched no case ({len(unmatched)})\n\nThey excused nothing in this run "
            "(its plan may not reach them, or they no longer apply).\n\n| entry | globs |\n|---|---|\n" + rows)
