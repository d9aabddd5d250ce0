"""The dimensions of a case, declared once: the case id (spelled and parsed here), the plan's product, the matrix
columns, the page's filters and `--resume`'s fingerprint all follow from this list.

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
    # where its values are declared (`module:NAME`, a dict by name): an optional part of an id (an axis with a
    # default joined by `/`) is told from the next one by its value
    values: str | None = None

    def known(self) -> dict:
        """Its values by name, from where they are declared (imported when first asked: they import this module)."""
        import importlib

        module, _, name = (self.values or "").partition(":")
        return getattr(importlib.import_module(module), name) if module else {}


AXES: tuple[Axis, ...] = (
    Axis("model", "models", "model", product=False),
    Axis("shape", "shapes", "shape", default="default", joiner="@", product=False),
    Axis("layout", "layouts", "layout", product=False),
    Axis("backend", "backends", "backend"),
    Axis("dtype", "dtypes", "dtype"),
    Axis("kind", "kinds", "kind", product=False),
    Axis("load", "loads", "load", default="enable", values="harness.loads:LOADS"),  # how the model is loaded
    # what the user calls around enable_parallelism (harness.flows), before it or after it (`_after`)
    Axis("flow", "flows", "flow", default="none", values="harness.flows:VALUES"),
    Axis("mode", "modes", "mode", default="eager", values="harness.core.modes:MODES"),  # eager or compiled
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


def _form() -> str:
    """How an id is written, for an error message: `model[@shape]/layout/.../kind[/mode][+fault]`."""
    text = ""
    for index, axis in enumerate(AXES):
        written = (axis.joiner if index else "") + axis.name
        text += written if axis.default is None else f"[{written}]"
    return text + f"[{FAULT}fault]"


def _parts() -> tuple[tuple[Axis, ...], ...]:
    """The axes each `/`-separated part of an id holds: an axis joined by `/` starts a part, one joined otherwise
    (`@shape`) rides on the part before it."""
    parts: list[list[Axis]] = []
    for axis in AXES:
        if parts and axis.joiner != "/":
            parts[-1].append(axis)
        else:
            parts.append([axis])
    return tuple(tuple(part) for part in parts)


FORM = _form()
_PARTS = _parts()


def parse(case_id: str) -> dict[str, str | None]:
    """`spell`'s exact inverse: every axis's value (a default one too) and `fault` (None without one). The parts
    whose leading axis has a default (`/load`, `/mode`) are each present or not, told apart by their values. A
    ValueError naming the id for anything `spell` cannot have written."""
    texts = case_id.split("/")
    texts[-1], plus, fault = texts[-1].partition(FAULT)
    required = [part for part in _PARTS if part[0].default is None]
    optional = [part for part in _PARTS if part[0].default is not None]
    if not len(required) <= len(texts) <= len(_PARTS):
        raise ValueError(f"case id {case_id!r} is not of the form {FORM}: {len(texts)} `/`-separated part(s), not "
                         f"{len(required)} to {len(_PARTS)}")
    extra = texts[len(required):]
    given = [(part, text) for part, text in zip(required, texts, strict=False)]
    for part in optional:
        if extra and extra[0] in part[0].known():
            given.append((part, extra.pop(0)))
    if extra:
        raise ValueError(f"case id {case_id!r} is not of the form {FORM}: {extra[0]!r} is none of the values of "
                         f"{', '.join(part[0].name for part in optional)} (or not in their order)")
    values: dict[str, str | None] = {}
    for part, text in given:
        for axis in reversed(part[1:]):
            head, joiner, value = text.rpartition(axis.joiner)
            values[axis.name], text = (value, head) if joiner else (axis.default, text)
        values[part[0].name] = text
    values = {axis.name: values.get(axis.name, axis.default) for axis in AXES}
    empty = [name for name, value in values.items() if not value] + (["fault"] if plus and not fault else [])
    if empty or spell(values, fault) != case_id:
        why = f"no {', '.join(empty)}" if empty else "a default written out, which an id leaves out"
        raise ValueError(f"case id {case_id!r} is not of the form {FORM}: {why}")
    return {**values, "fault": fault or None}


def file_stem(case_id: str) -> str:
    """The case id as a file name: each axis joiner a dash (`qwenimage-masked-ulysses2-native-fp32-tensor`)."""
    for joiner in dict.fromkeys(axis.joiner for axis in AXES):
        case_id = case_id.replace(joiner, "-")
    return case_id


def product_axes() -> tuple[Axis, ...]:
    """The axes whose every value the plan crosses with every case (backend, dtype, mode, and any axis added later)."""
    return tuple(axis for axis in AXES if axis.product)
