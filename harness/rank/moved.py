"""Where one run first left another's per-module fingerprints (harness.rank.fingerprint): a one-device run against
the fingerprints its reference stores, or a layout's second run against its first on each rank (repeat
determinism). Rows and lines as the layout's own localization writes them (harness.rank.localize), so every view
draws them alike."""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.core.records import ModuleTrace
from harness.rank import fingerprint, localize

Parts = dict[str, tuple[list[str], torch.Tensor]]


def compare(stored: Parts, new: Parts, limit: Callable[[str, str], float]) -> dict[str, ModuleTrace]:
    """Per part ("forward", "backward"), each module of `new` in its order against the same module in `stored`, and
    the first whose output left it by more than `limit(part, module)`: named as the layout's localization names
    it (a module whose input had left already is the module around it, first seen at that child)."""
    called = set(new.get("forward", ([], None))[0])
    traces = {}
    for part in ("forward", "backward"):
        if part not in new:
            continue
        rows = _rows(part, stored, new, limit)
        first = next((index for index, row in enumerate(rows) if row.get("error") is not None
                      and not row["error"] <= row["limit"]), None)
        uncompared = [row["module"] for row in rows if row.get("error") is None]
        traces[part] = ModuleTrace(rows, first, localize.first_line(rows, first, called), uncompared)
    return traces


def _rows(part: str, stored: Parts, new: Parts, limit: Callable[[str, str], float]) -> list[dict]:
    names, values = new[part]
    inputs = new.get(part + "_in", (names, None))[1]
    if part not in stored:
        return [{"module": name, "error": None, "how": f"the reference holds no {part}"} for name in names]
    index = {name: position for position, name in enumerate(stored[part][0])}
    old_values, old_inputs = stored[part][1], stored.get(part + "_in", (None, None))[1]
    rows = []
    for position, name in enumerate(names):
        if name not in index:
            rows.append({"module": name, "error": None, "how": "not in the reference (a module it did not run)"})
            continue
        row = {"module": name, "error": fingerprint.difference(values[position], old_values[index[name]]),
               "limit": limit(part, name), "how": "fingerprint"}
        if inputs is not None and old_inputs is not None:
            row["input_error"] = fingerprint.difference(inputs[position], old_inputs[index[name]])
        rows.append(row)
    return rows


def summary(traces: dict[str, ModuleTrace]) -> str:
    """One line: the first module that moved, forward then backward (`backward: ...`), or none."""
    return localize.summary(traces["forward"], traces.get("backward"))


def worst(traces: dict[str, ModuleTrace]) -> dict | None:
    """The compared row furthest past (or nearest to) its limit, with its part: what the figure shows."""
    rows = [(part, row) for part, trace in traces.items() for row in trace.modules if row.get("error") is not None]
    if not rows:
        return None
    part, row = max(rows, key=lambda item: item[1]["error"] / max(item[1]["limit"], 1e-300))
    return {**row, "part": part}
