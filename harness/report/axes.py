"""The dimensions of a case as the report reads them (harness.core.axes, where they are declared once): which fields
spell its id (and how), which the page filters on, and where each sits in the matrix. Every view takes them from
`axes()`, so a new dimension reaches the page's filters, its matrix and its id spelling from its declaration alone.
A case whose id the parts do not spell (a negative control's `+fault`) has its id embedded.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from harness.core import axes as declared

# Where the matrix puts an axis, outer first: one section per model, rows layout x backend x load x flow (a load's or
# a flow's row under its layout's: each runs on a few layouts only, and as columns they made flux's quick-plan matrix
# 61 columns and 15,000 px wide), columns shape x kind x dtype; an axis not named here is a column after these.
MATRIX = {"section": ("model",), "row": ("layout", "backend", "load", "flow"), "column": ("shape", "kind", "dtype")}


@cache
def axes() -> tuple[dict[str, Any], ...]:
    """The id's parts, in the id's order: {"name", "before" (the text written before it), "omit" (a value written as
    nothing, with its `before`; absent when every value is written)}."""
    found = []
    for index, axis in enumerate(declared.AXES):
        part = {"name": axis.name, "before": axis.joiner if index else ""}
        if axis.default is not None:
            part["omit"] = axis.default
        found.append(part)
    return tuple(found)


def names() -> list[str]:
    return [axis["name"] for axis in axes()]


def matrix() -> dict[str, list[str]]:
    """The axes of the matrix's sections, rows and columns (each outer first); every axis is in exactly one."""
    placed = {name for group in MATRIX.values() for name in group}
    out = {place: [name for name in group if name in names()] for place, group in MATRIX.items()}
    out["column"] += [name for name in names() if name not in placed]
    return out


def spell(case: dict[str, Any]) -> str:
    """The id the parts of `case` spell, as the page script spells it (`spellId` in static/report.js)."""
    out = []
    for axis in axes():
        value = case.get(axis["name"], axis.get("omit"))  # an axis declared after the record was written: its default
        if "omit" in axis and value == axis["omit"]:
            continue
        out.append(f"{axis['before']}{value}")
    return "".join(out)
