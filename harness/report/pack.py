"""How the page's data writes values: figures' text in their own format, non-finite floats as text, numbers no more
precise than the page shows them, and `extra` values packed so that what repeats across cases is stored once.

A packed dict names in its "$" key the members it stores as indices into the value table (`packed`): a histogram's
edges, a comms table, a table block's columns, a pictures block's note are the same in many cases. The page script's
`unpack` reverses it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.core import figures
from harness.report.detail import safe_relative

REFS = "$"  # the key of a packed dict that lists its members stored in the value table
PACKED_MIN = 40  # members whose JSON is at least this long are stored in the value table
DIGITS = 4  # significant digits of the numbers the page writes with no format of its own (static/format.js text)


def finite(value: Any) -> Any:
    """JSON has no NaN or Infinity (JSON.parse rejects them): non-finite floats become "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(key): finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def rounded(value: Any) -> Any:
    """A float with DIGITS significant digits (the page writes no more), anything else as it is; nested lists too."""
    if isinstance(value, list):
        return [rounded(item) for item in value]
    if isinstance(value, float) and math.isfinite(value) and value:
        return float(f"{value:.{DIGITS}g}")
    return value


def written(figure: dict[str, Any]) -> str:
    """The figure's value as its format writes it; a value the format cannot write (a float under "d") in `number`."""
    try:
        return figures.written(figure)
    except (TypeError, ValueError):
        return number(figure.get("value"))


def ratio(figure: dict[str, Any]) -> str:
    """The share of its limit a figure used, in the figure's direction (`figures.margin`: an error's value / limit,
    SSIM's deficit from 1 against the allowed one), written as the cell and the deciding check's text write it
    (`figures.times`; "" where it means nothing: no number, a zero limit). A figure from before figures declared
    their bound reads as an upper bound."""
    value, limit = figure.get("value"), figure.get("limit")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (value, limit)):
        return ""
    if not limit or not math.isfinite(value) or not math.isfinite(limit):
        return ""
    used = figures.margin(value, limit, figure.get("bound", "<="), figure.get("ideal", 0.0))
    return figures.times(used).replace("x", "\u00d7")  # as the cell and the deciding check's text write it


def number(value: Any) -> str:
    """A number with no format of its own (a failed check's): three significant digits; text as it is."""
    if value is None or isinstance(value, bool):
        return ""
    return format(value, ".3g") if isinstance(value, (int, float)) and math.isfinite(value) else str(value)


def band(low_high: Any) -> str:
    """A known issue's measured band as the page writes it ("[0.15, 0.45]"; "" for none)."""
    if not isinstance(low_high, (list, tuple)) or len(low_high) != 2:
        return ""
    return f"[{number(low_high[0])}, {number(low_high[1])}]"


def packed(value: Any, values) -> Any:
    """`value` with the larger members of each dict in it (lists, dicts, text) stored in `values` (a Table), named
    in the dict's "$"; a table block's cells rounded to DIGITS (the page writes them so)."""
    if isinstance(value, list):
        return [packed(item, values) for item in value]
    if not isinstance(value, dict):
        return value
    if value.get("type") == "table" and isinstance(value.get("rows"), list):
        value = {**value, "rows": [rounded(row) for row in value["rows"]]}
    out, refs = {}, []
    for key, item in value.items():
        item = packed(item, values)
        if isinstance(item, (list, dict, str)) and len(json.dumps(item, separators=(",", ":"))) >= PACKED_MIN:
            item, refs = values.index(item), [*refs, key]
        out[key] = item
    return {**out, REFS: refs} if refs else out


def safe(key: str, value: Any) -> Any:
    """Images are files beside the report: paths with a scheme, a host or an absolute path never reach the page
    (None: nothing of the value is left)."""
    if key == "images":
        return _safe_images(value) or None
    if key == "blocks" and isinstance(value, list):
        return [{**block, "images": _safe_images(block.get("images"))} if isinstance(block, dict)
                and block.get("type") == "images" else block for block in value]
    return value


def _safe_images(images: Any) -> dict[str, str]:
    if not isinstance(images, dict):
        return {}
    found = {str(name): safe_relative(path) for name, path in images.items()}
    return {name: path for name, path in found.items() if path is not None}
