"""The records, embedded once in index.html as compact JSON that the page script renders from.

A full plan is 15,600 cases, most of them SKIP rows that differ only in a few repeated strings, and about a
thousand XFAIL rows with the same few tracebacks. So every string (and every `extra` value) is stored once in a
table and cases refer to it by index; a case is an array in FIELDS order with its trailing empty fields dropped, and
a case id that the other fields spell (`model[@shape]/layout/backend/dtype/kind`) is not stored at all.
Numbers are kept as written in results.json, non-finite ones as the strings "nan", "inf", "-inf".
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.report.detail import safe_relative

# The order of a case's array. The page script (script.py) reads the same names in the same order.
FIELDS = ("case_id", "model", "shape", "kind", "layout", "backend", "dtype", "status", "reason", "world_size",
          "dispatched", "kernels", "comms", "max_abs_err", "mean_abs_err", "max_rel_err", "tolerance", "baseline_err",
          "err_ratio", "nonfinite", "ssim", "psnr", "seconds", "peak_mem_mb", "loss_err", "grad_err", "worst_param",
          "first_divergence", "extra")
STRINGS = frozenset({"model", "shape", "kind", "layout", "backend", "dtype", "status", "reason", "dispatched",
                     "kernels", "comms", "worst_param", "first_divergence"})
SPELLED = -1  # the case_id slot when the other fields spell the id


class Table:
    """Distinct values in order of first use; `index` returns a value's position, adding it if new."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._seen: dict[str, int] = {}

    def index(self, value: Any) -> int:
        key = value if isinstance(value, str) else "\0" + json.dumps(value, sort_keys=True, default=str)
        if key not in self._seen:
            self._seen[key] = len(self.values)
            self.values.append(value)
        return self._seen[key]


def spelled_id(case: dict[str, Any]) -> str:
    """The id the plan gives a case with these fields (harness.run.plan.Case.case_id, without a fault suffix)."""
    model = case["model"] if case["shape"] == "default" else f"{case['model']}@{case['shape']}"
    return f"{model}/{case['layout']}/{case['backend']}/{case['dtype']}/{case['kind']}"


def encode(cases: list[dict[str, Any]], groups: dict[str, list[int]]) -> dict[str, Any]:
    """{"s": strings, "v": extra values, "c": one array per case, "g": group name -> case indices}."""
    strings, values = Table(), Table()
    rows = [_row(case, strings, values) for case in cases]
    return {"s": strings.values, "v": values.values, "c": rows, "g": groups}


def _row(case: dict[str, Any], strings: Table, values: Table) -> list[Any]:
    row: list[Any] = []
    for name in FIELDS:
        value = case.get(name)
        if name == "case_id":
            value = SPELLED if value == spelled_id(case) else strings.index(value)
        elif name == "extra":
            value = _extra(_own(value, case), strings, values) or None
        elif name in STRINGS:
            value = strings.index(value or "")
        row.append(finite(value))
    while row and row[-1] is None:
        row.pop()
    return row


def _own(extra: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    """`extra` without the ssim/psnr copies data.load made of the columns (embedded once, as columns)."""
    return {key: value for key, value in extra.items() if not (key in ("ssim", "psnr") and value == case.get(key))}


def _extra(extra: dict[str, Any], strings: Table, values: Table) -> list[int]:
    """[key, value, key, value, ...] as table indices; image paths a page must not load are dropped here."""
    out: list[int] = []
    for key, value in extra.items():
        if key == "images":
            value = _safe_images(value)
            if not value:
                continue
        elif key == "abs_err_hist" and isinstance(value, dict):  # the edges repeat, the counts do not
            value = {**value, "edges": values.index(value.get("edges"))}
        out += [strings.index(str(key)), values.index(finite(value))]
    return out


def finite(value: Any) -> Any:
    """JSON has no NaN or Infinity (JSON.parse rejects them): non-finite floats become "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(key): finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def _safe_images(images: Any) -> dict[str, str]:
    if not isinstance(images, dict):
        return {}
    safe = {str(name): safe_relative(path) for name, path in images.items()}
    return {name: path for name, path in safe.items() if path is not None}


def script_tag(data: dict[str, Any], element_id: str = "report-data") -> str:
    """A JSON <script> block: `<` is written as \\u003c, so no string in it can close the element."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'
