"""The dimensions of a case, declared once: the case id, the plan's product, the matrix columns, the page's filters
and `--resume`'s fingerprint all follow from this list.

Each axis is a field of `Case` and of `CaseResult` of the same name, listed by the plan option of its own name
(`models`, `layouts`, ...). An axis with a `default` is left out of the id at that value, so an axis added later
leaves every existing id as it was.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Axis:
    name: str  # the Case and CaseResult field, the CSV column, the page's filter
    option: str  # the plan option that lists its values
    label: str  # for people (a column header, a filter's title)
    default: str | None = None  # the value the case id leaves out (None: always written)
    joiner: str = "/"  # what joins it to the id before it ("@" writes a model's shape)
    product: bool = True  # the plan takes every value for every case (False: model, kind, shape, which it scopes)


AXES: tuple[Axis, ...] = (
    Axis("model", "models", "model", product=False),
    Axis("shape", "shapes", "shape", default="default", joiner="@", product=False),
    Axis("layout", "layouts", "layout", product=False),
    Axis("backend", "backends", "backend"),
    Axis("dtype", "dtypes", "dtype"),
    Axis("kind", "kinds", "kind", product=False),
    Axis("load", "loads", "load", default="enable"),  # enable_parallelism or from_pretrained (harness.core.loads)
    Axis("mode", "modes", "mode", default="eager"),  # eager or compiled (harness.core.modes)
)
NAMES = tuple(axis.name for axis in AXES)
FAULT = "+"  # what joins a negative control's fault to the id of the case it breaks


def spell(values: dict[str, str], fault: str | None = None) -> str:
    """The case id of these axis values: `model[@shape]/layout/backend/dtype/kind[/load][/mode][+fault]`."""
    text = ""
    for axis in AXES:
        value = str(values[axis.name] if axis.default is None else values.get(axis.name, axis.default))
        if axis.default is not None and value == axis.default:
            continue
        text += (axis.joiner if text else "") + value
    return text + (f"{FAULT}{fault}" if fault else "")


def product_axes() -> tuple[Axis, ...]:
    """The axes whose every value the plan crosses with every case (backend, dtype, mode, and any axis added later)."""
    return tuple(axis for axis in AXES if axis.product)


def declaration() -> list[dict]:
    """The axes as the page reads them (its filters and how it spells an id)."""
    return [{"name": axis.name, "label": axis.label, "default": axis.default, "joiner": axis.joiner} for axis in AXES]
