"""The dimensions of a case as the report reads them: which fields spell its id (and how), which the page filters on,
and where each sits in the matrix. Every view takes them from `axes()`, so a new dimension reaches the page's
filters, its matrix and its id spelling from here alone.

The id's format has one definition, `harness.core.records.case_id`; `axes()` reads its parts off that function
(calling it with a marker per part) rather than restating it, and `spell` writes an id back from the parts the way
the page script does. A case whose id the parts do not spell (a negative control's `+fault`) has its id embedded.
When `harness.core.axes` lands, `axes()` is the one function to repoint.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields
from functools import cache
from typing import Any

from harness.core import records
from harness.core.results import CaseResult

# Where the matrix puts an axis, outer first: one section per model, rows layout x backend, columns shape x kind x
# dtype; an axis not named here is a column after these.
MATRIX = {"section": ("model",), "row": ("layout", "backend"), "column": ("shape", "kind", "dtype")}


@cache
def axes() -> tuple[dict[str, Any], ...]:
    """The id's parts that are fields of a result, in the id's order: {"name", "before" (the text written before
    it), "omit" (a value written as nothing, with its `before`; absent when every value is written)}."""
    names = list(inspect.signature(records.case_id).parameters)
    markers = {name: f"\x01{index}\x02" for index, name in enumerate(names)}
    full = records.case_id(**markers)
    defaults = {f.name: f.default for f in fields(records.Case) if f.default is not MISSING}
    result_fields = {f.name for f in fields(CaseResult)}
    found, at = [], 0
    for name in names:
        start = full.index(markers[name])
        axis = {"name": name, "before": full[at:start]}
        at = start + len(markers[name])
        left_out = full.replace(axis["before"] + markers[name], "", 1)
        if name in defaults and records.case_id(**{**markers, name: defaults[name]}) == left_out:
            axis["omit"] = defaults[name]
        if name in result_fields:
            found.append(axis)
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
        value = case.get(axis["name"])
        if "omit" in axis and value == axis["omit"]:
            continue
        out.append(f"{axis['before']}{value}")
    return "".join(out)
