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
REFERENCE = "reference"  # one device against the per-module fingerprints its stored reference holds (its drift)
REPEAT = "repeat"  # the case run twice in one launch: how far the second run is from the first (0: bit for bit)


@dataclass(frozen=True)
class FigureSpec:
    """A figure a kind measures: its `name` (the CSV column, the key in `results.json`), a `label` for people, the
    format of its value (`fmt`, a Python format spec; "" for text), `cell`: how the matrix cell writes it when it
    is the key figure (a format with `{value}`, e.g. "g{value:.0e}"; "" when it is not), and its `role` ("" for
    none; `PARITY`, `SINGLE_DEVICE`). A figure with a `short` name (how a cell names it) is a check its limit
    bounds, one that may decide the case (`deciding`): `at_least` says the value must reach the limit (SSIM, PSNR)
    rather than stay under it, and `ideal` is the value of a run that adds no error (0 for an error, 1 for SSIM and
    for a ratio to one device's own error; None: unbounded, a figure in decibels), from which its margin is
    measured (`margin`). A figure without one keeps its limit for the reader only (a kind's own, whose limit may
    bound something else, such as a ratio's distance from 1)."""

    name: str
    label: str
    fmt: str = ".3g"
    cell: str = ""
    role: str = ""
    short: str = ""
    at_least: bool = False
    ideal: float | None = 0.0

    def of(self, value: Any, limit: float | None = None, derived: str = "", ideal: float | None = None,
           subject: str = "") -> dict:
        """The figure as a result keeps it: name, value and, where it answers to one, its limit, how that limit was
        derived (`derived`, in words), and the ideal it is measured from when this run's differs from the spec's
        (a budget over one device's own error); `subject`: the one thing it is about (a parameter)."""
        figure = {"name": self.name, "label": self.label, "value": value, "fmt": self.fmt}
        if limit is not None:
            figure["limit"] = limit
            if self.short:
                figure.update(short=self.short, bound=">=" if self.at_least else "<=",
                              ideal=self.ideal if ideal is None else ideal)
            if derived:
                figure["derived"] = derived
        for key, given in (("cell", self.cell), ("role", self.role), ("subject", subject)):
            if given:
                figure[key] = given
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


def margin(value: float, limit: float, bound: str = "<=", ideal: float | None = 0.0) -> float:
    """How much of its allowance a check used: 0 at the ideal, 1 at the limit, above 1 past it. An upper bound's
    (value - ideal) / (limit - ideal); a lower bound's deficits, (ideal - value) / (ideal - limit) (SSIM); a lower
    bound in decibels with no ideal (PSNR) the ratio of the errors it stands for, 10^((limit - value) / 10)."""
    if math.isnan(value):
        return math.inf
    if not (math.isfinite(value) and math.isfinite(limit)):
        return 0.0 if value == limit or (value < limit) == (bound == "<=") else math.inf
    if bound == ">=" and ideal is None:
        return 10 ** ((limit - value) / 10)
    ideal = ideal or 0.0
    used, allowed = (value - ideal, limit - ideal) if bound == "<=" else (ideal - value, ideal - limit)
    if allowed <= 0:  # a limit at the ideal: anything past it is infinitely over
        return 0.0 if used <= 0 else math.inf
    return max(used, 0.0) / allowed


def deciding(figures: list[dict], evidence: list[dict] = ()) -> dict | None:
    """The check that decided the case: of every figure a kind declares a check (`FigureSpec.short`) and every
    failed check with a number that no figure stands for (a parameter's weights, a rank's output), the one that used
    most of its allowance (the first on a tie: figures carry how their limit was derived). None when the case has
    no check with a number."""
    named = {figure["name"] for figure in figures}
    checks = [figure for figure in figures if "bound" in figure and is_number(figure.get("value"))]
    checks += [{"name": item["check"], "label": item["check"].replace("_", " "),
                "short": item["check"].replace("_", " "), "value": item["value"], "limit": item["limit"],
                "bound": "<=", "ideal": 0.0,
                **({"subject": item["subject"]} if item.get("subject") else {})}
               for item in evidence if item["check"] not in named and is_number(item.get("value"))
               and is_number(item.get("limit"))]
    best = None
    for check in checks:
        used = margin(float(check["value"]), float(check["limit"]), check["bound"], check["ideal"])
        if best is None or used > best["margin"]:
            best = {**{key: check[key] for key in ("name", "label", "short", "value", "limit", "bound", "ideal")
                       if key in check}, **{key: check[key] for key in ("subject", "derived") if key in check},
                    "margin": used}
    if best is not None:
        best["text"] = decided_text(best)
    return best


def decided_text(check: dict) -> str:
    """`SSIM 0.9994 >= 0.99 (0.06x of its allowance; limit: fixed, the bf16 entry of image_limits)`: the check,
    its direction, how much of its allowance it used, and how its limit was derived. A check held to exactly its
    ideal (ranks that must agree bit for bit: limit 0) has no share to speak of: it says so."""
    about = f" [{check['subject']}]" if check.get("subject") else ""
    derived = f"; limit: {check['derived']}" if check.get("derived") else ""
    over = check["margin"] > 1
    bound = {"<=": ">" if over else "<=", ">=": "<" if over else ">="}[check["bound"]]
    share = ("exact: any difference from " + _number(check["limit"]) + " fails" if is_exact(check)
             else f"{times(check['margin'])} of its allowance")
    return f"{check['label']}{about} {_number(check['value'])} {bound} {_number(check['limit'])} ({share}{derived})"


def decided_cell(check: dict) -> str:
    """The matrix cell of a deciding check: its short name and the share of its allowance it used; a check held to
    exactly its limit (limit 0: no allowance to share) its value against that limit (`ranks disagree 0.0037 > 0`)."""
    if is_exact(check) and float(check["margin"]) > 0:
        return f"{check['short']} {float(check['value']):.2g} {'<' if check['bound'] == '>=' else '>'} " \
               f"{_number(check['limit'])}"
    return f"{check['short']} {times(check['margin'])}"


def is_exact(check: dict) -> bool:
    """Whether a deciding check's limit is its ideal (no allowance: any difference fails), e.g. ranks that must agree
    exactly. A check from a file written before the deciding check kept its ideal reads a limit of 0 as exact."""
    ideal = check.get("ideal", 0.0)
    return is_number(ideal) and is_number(check.get("limit")) and float(check["limit"]) == float(ideal)


def times(used: float | str) -> str:
    """A share of an allowance as every view writes it: `0.50x`, `3155x`, `1.2e+05x`."""
    used = float(used)  # results.json writes an infinite margin as "inf"
    return f"{used:.2f}x" if used < 10 else (f"{used:.0f}x" if used < 1e5 else f"{used:.1e}x")


def _number(value: float) -> str:
    return format(value, ".4g")


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
