"""Which transformer classes of the installed diffusers define a parallel plan, read from the package itself.

A hard-coded list would go stale silently when diffusers adds `_cp_plan` / `_tp_plan` to another model; walking
`diffusers.models.transformers` makes a new class show up as uncovered (see tests/unit/test_zoo.py).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil


def _plan_classes(module) -> list[type]:
    """ModelMixin subclasses defined in `module` (not merely imported there) whose plan attribute is set."""
    from diffusers.models.modeling_utils import ModelMixin

    found = []
    for _, value in inspect.getmembers(module, inspect.isclass):
        if value.__module__ != module.__name__ or not issubclass(value, ModelMixin):
            continue
        if getattr(value, "_cp_plan", None) is not None or getattr(value, "_tp_plan", None) is not None:
            found.append(value)
    return found


def _transformer_modules() -> tuple[list, list[tuple[str, str]]]:
    """Every module of `diffusers.models.transformers`, and (name, error) for any that fails to import here."""
    package = importlib.import_module("diffusers.models.transformers")
    modules, failed = [], []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda item: item.name):
        name = f"{package.__name__}.{info.name}"
        try:
            modules.append(importlib.import_module(name))
        except Exception as error:  # noqa: BLE001 - an optional dependency missing here must not hide the others
            failed.append((name, f"{type(error).__name__}: {error}"))
    return modules, failed


def _covering_specs() -> dict[str, str]:
    from harness.catalogue.zoo import SPECS

    covering: dict[str, str] = {}
    for spec in SPECS.values():  # a class may have variant specs (helios_amplify): the first one names it
        covering.setdefault(spec.class_name, spec.name)
    return covering


@functools.lru_cache(maxsize=1)
def _discover() -> tuple[tuple[dict, ...], tuple[tuple[str, str], ...]]:
    modules, failed = _transformer_modules()
    covering = _covering_specs()
    rows = []
    for module in modules:
        for cls in _plan_classes(module):
            rows.append({
                "class_name": cls.__name__,
                "module": cls.__module__,
                "has_cp_plan": getattr(cls, "_cp_plan", None) is not None,
                "has_tp_plan": getattr(cls, "_tp_plan", None) is not None,
                "spec": covering.get(cls.__name__),
            })
    rows.sort(key=lambda row: row["class_name"])
    return tuple(rows), tuple(failed)


def parallel_classes() -> list[dict]:
    """One dict per class with a plan: class_name, module, has_cp_plan, has_tp_plan, spec (zoo name or None).

    Cached per process: importing every transformer module costs a few seconds the first time.
    """
    rows, _ = _discover()
    return [dict(row) for row in rows]


def import_failures() -> list[tuple[str, str]]:
    """Transformer modules that could not be imported here, so a class hidden by a missing extra is not missed."""
    _, failed = _discover()
    return list(failed)
