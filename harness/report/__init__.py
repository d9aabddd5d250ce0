"""The views of results.json: the per-run report page (index.html), the comparison of two runs (compare.html and
its Markdown), the text views (matrix.py) and the writing of all of them (write.py)."""

from harness.report.compare import Comparison, changed_markdown, status_changes
from harness.report.compare_page import compare_runs
from harness.report.html import render_html

__all__ = ["render_html", "compare_runs", "changed_markdown", "status_changes", "Comparison"]
