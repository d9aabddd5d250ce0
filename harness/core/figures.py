"""Figures: the numbers a kind measured for a case, typed, so that every view renders them without knowing the kind.

A kind declares each figure once (`FigureSpec`: its name, how it is written, which one is the matrix cell's) and its
judge fills them (`spec.of(value, limit)`). A result keeps them as plain dicts in `figures`, in the kind's order, and
the cell text the key figure makes (`cell`), computed here once for the terminal, the page and the Markdown. A
figure may also carry a `role` (`PARITY`, `SINGLE_DEVICE`): what a reader that knows no kind asks of it.
Detail blocks (`series`, `table`, `histogram`, `images`) are what the page draws of a case beyond its figures; a kind
produces them and the page renders them by their type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# The roles a figure may play for a reader that knows no kind (`harness ab` reads both; a kind marks at most one
# figure with each):
PARITY = "parity"  # the layout against its own single-device run of the same dtype and backend (the parallel parity)
SINGLE_DEVICE = "single_device"  # that single-device run's own key figure, as a `single` case of it would show it


@dataclass(frozen=True)
class FigureSpec:
    """A figure a kind measures: its `name` (the CSV column, the key in `results.json`), a `label` for people, the
    format of its value (`fmt`, a Python format spec; "" for text), `cell`: how the matrix cell writes it when it
    is the key figure (a format with `{value}`, e.g. "g{value:.0e}"; "" when it is not), and its `role` ("" for
    none; `PARITY`, `SINGLE_DEVICE`)."""

    name: str
    label: str
    fmt: str = ".3g"
    cell: str = ""
    role: str = ""

    def of(self, value: Any, limit: float | None = None) -> dict:
        """The figure as a result keeps it: name, value and, where it answers to one, its limit."""
        figure = {"name": self.name, "label": self.label, "value": value, "fmt": self.fmt}
        if limit is not None:
            figure["limit"] = limit
        if self.cell:
            figure["cell"] = self.cell
        if self.role:
            figure["role"] = self.role
        return figure


def value(figures: list[dict], name: str) -> Any:
    """The value of the figure `name` (None when the case has none)."""
    return next((figure["value"] for figure in figures if figure["name"] == name), None)


def with_role(figures: list[dict], role: str) -> dict | None:
    """The figure that plays `role` (`PARITY`, `SINGLE_DEVICE`) and holds a number, or None."""
    return next((figure for figure in figures if figure.get("role") == role and is_number(figure.get("value"))), None)


def is_number(value: Any) -> bool:
    """A measured number: int or float, not bool, not the text results.json writes for NaN and Inf."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def limit(figures: list[dict], name: str) -> float | None:
    return next((figure.get("limit") for figure in figures if figure["name"] == name), None)


def written(figure: dict) -> str:
    """The figure's value as the detail writes it (its own format; text as is; NaN and Inf spelled out)."""
    number = figure.get("value")
    if number is None:
        return ""
    if isinstance(number, str) or not figure.get("fmt"):
        return str(number)
    if isinstance(number, float) and not math.isfinite(number):
        return str(number)
    return format(number, figure["fmt"])


def cell_figure(figures: list[dict]) -> dict | None:
    """The figure the matrix cell writes: the first with a cell format and a value (None when none has one)."""
    return next((figure for figure in figures if figure.get("cell") and figure.get("value") is not None), None)


def cell(figures: list[dict]) -> str:
    """The matrix cell's text: its figure (`cell_figure`) in the figure's cell format ("" when there is none)."""
    figure = cell_figure(figures)
    if figure is None:
        return ""
    number = figure["value"]
    if isinstance(number, str) or (isinstance(number, float) and not math.isfinite(number)):
        return str(number)  # NaN or Inf (as results.json writes them)
    return figure["cell"].format(value=number)


def columns(results) -> list[str]:
    """Every figure name of `results`, in the order the kinds declare them (first seen first)."""
    names: dict[str, None] = {}
    for result in results:
        for figure in result.figures:
            names.setdefault(figure["name"], None)
    return list(names)


# --- detail blocks: what the page draws of a case, by type ------------------------------------------------------------


def series(title: str, lines: list[tuple[str, list, str]], x_label: str = "step", note: str = "") -> dict:
    """Lines over a shared x (loss per step): (label, values, style) each; styles `ref`, `run`, `base`."""
    return {"type": "series", "title": title, "x": x_label, "note": note,
            "lines": [{"label": label, "values": values, "style": style} for label, values, style in lines]}


def table(title: str, columns_: list[str], rows: list[list], code_columns: tuple[int, ...] = ()) -> dict:
    """A table of values; `code_columns` are names (parameters, modules) written as code."""
    return {"type": "table", "title": title, "columns": columns_, "rows": rows, "code": list(code_columns)}


def histogram(title: str, edges: list[float], counts: list[int], marker: float | None = None) -> dict:
    """Counts per decade between `edges`, with an optional `marker` (a limit) drawn across."""
    return {"type": "histogram", "title": title, "edges": edges, "counts": counts, "marker": marker}


def images(title: str, paths: dict[str, str], captions: dict[str, str] | None = None,
           scales: dict[str, dict] | None = None) -> dict:
    """Pictures of the case, by role (reference, candidate, diff, ...), as paths relative to the report folder;
    `captions` by role (default: the role's name), and a role's colour scale (`{"ticks": [black, ..., white],
    "note": what the brightness means}`) drawn under its picture."""
    block = {"type": "images", "title": title, "images": paths}
    if captions:
        block["captions"] = captions
    if scales:
        block["scales"] = scales
    return block
