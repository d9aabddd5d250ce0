"""HTML views of results.json: the per-run report page and the comparison of two runs."""

from harness.report.compare import Comparison, changed_markdown, compare_runs, status_changes
from harness.report.html import render_html

__all__ = ["render_html", "compare_runs", "changed_markdown", "status_changes", "Comparison"]
