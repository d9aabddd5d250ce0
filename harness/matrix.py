"""Results -> the pass/fail matrix: one CSV row per case, a Markdown grid for CI summaries, a terminal view."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from harness.results import CaseResult, Status

CSV_COLUMNS = ["case_id", "model", "shape", "kind", "layout", "world_size", "backend", "dtype", "status",
               "max_abs_err", "mean_abs_err", "max_rel_err", "tolerance", "baseline_err", "err_ratio", "nonfinite",
               "ssim", "psnr",
               "dispatched", "kernels", "reason", "seconds", "peak_mem_mb"]

MARK = {Status.PASS: "PASS", Status.FAIL: "**FAIL**", Status.ERROR: "**ERROR**", Status.SKIP: "skip",
        Status.TIMEOUT: "**TIMEOUT**", Status.XFAIL: "xfail"}


def to_frame(results: list[CaseResult]) -> pd.DataFrame:
    rows = []
    for result in results:
        row = result.to_dict()
        rows.append({column: row.get(column) for column in CSV_COLUMNS})
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def counts(results: list[CaseResult]) -> dict[str, int]:
    tally = Counter(result.status.value for result in results)
    return {status.value: tally.get(status.value, 0) for status in Status}


def counts_line(results: list[CaseResult]) -> str:
    return ", ".join(f"{count} {status}" for status, count in counts(results).items() if count)


def write_csv(results: list[CaseResult], path: Path) -> None:
    to_frame(results).to_csv(path, index=False)


def _cell(result: CaseResult, markdown: bool) -> str:
    label = MARK[result.status] if markdown else result.status.value
    if result.kind == "image" and result.ssim is not None:
        label += f" ssim {result.ssim:.4f}"
    elif result.status in (Status.PASS, Status.FAIL, Status.XFAIL) and result.max_abs_err is not None:
        label += f" {result.max_abs_err:.1e}"
    return label


def grid(results: list[CaseResult], markdown: bool = False) -> pd.DataFrame:
    """Rows model[@shape] x dtype (x kind), columns layout/backend; each cell the status and the max error."""
    frame = pd.DataFrame({
        "row": [_row_label(r) for r in results],
        "column": [f"{r.layout}/{r.backend}" for r in results],
        "cell": [_cell(r, markdown) for r in results],
    })
    table = frame.pivot_table(index="row", columns="column", values="cell", aggfunc="first", sort=False)
    return table.fillna("")


def _row_label(result: CaseResult) -> str:
    model = result.model if result.shape == "default" else f"{result.model}@{result.shape}"
    kind = "" if result.kind == "tensor" else f" {result.kind}"
    return f"{model} {result.dtype}{kind}"


def markdown(results: list[CaseResult], header_lines: list[str] = ()) -> str:
    lines = ["## Parity matrix", "", *header_lines, f"**{counts_line(results)}**", ""]
    table = grid(results, markdown=True)
    if not table.empty:
        columns = ["case", *table.columns]
        lines.append("| " + " | ".join(columns) + " |")
        lines.append("|" + "---|" * len(columns))
        for label, row in table.iterrows():
            lines.append("| " + " | ".join([label, *row.tolist()]) + " |")
    notable = [r for r in results if r.status not in (Status.PASS,) or r.reason]
    if notable:
        lines += ["", "### Not passing, or with a note", "", "| case | status | reason |", "|---|---|---|"]
        for result in notable:
            reason = result.reason.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{result.case_id}` | {result.status.value} | {reason} |")
    return "\n".join(lines) + "\n"


def terminal(results: list[CaseResult]) -> str:
    """Transposed grid (layout/backend rows), which fits a terminal better than the wide Markdown one."""
    table = grid([r for r in results if r.status is not Status.SKIP] or results).T
    table.index.name, table.columns.name = "layout/backend", None
    with pd.option_context("display.width", 250, "display.max_columns", None, "display.max_colwidth", 30):
        text = table.to_string() if not table.empty else "(no cases)"
    return f"{text}\n\n{counts_line(results)}"
