"""The plan: models x shapes x layouts x backends x dtypes, with what cannot run here decided up front (SKIP)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from itertools import product

import torch

from harness import backends as backend_info
from harness import faults
from harness.dtypes import torch_dtype
from harness.errors import HarnessError
from harness.layouts import Layout, parse_layout
from harness.zoo import get_spec


@dataclass(frozen=True)
class Case:
    model: str
    layout: Layout
    backend: str
    dtype: str
    kind: str = "tensor"
    shape: str = "default"
    fault: str | None = None  # a deliberate bug for negative controls (harness.faults)

    @property
    def case_id(self) -> str:
        model = self.model if self.shape == "default" else f"{self.model}@{self.shape}"
        fault = f"+{self.fault}" if self.fault else ""
        return f"{model}/{self.layout.name}/{self.backend}/{self.dtype}/{self.kind}{fault}"

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def to_dict(self) -> dict:
        return {"model": self.model, "layout": self.layout.name, "backend": self.backend, "dtype": self.dtype,
                "kind": self.kind, "shape": self.shape, "fault": self.fault}

    @classmethod
    def from_dict(cls, data: dict) -> Case:
        return cls(data["model"], parse_layout(data["layout"]), data["backend"], data["dtype"],
                   data.get("kind", "tensor"), data.get("shape", "default"), data.get("fault"))


@dataclass(frozen=True)
class PlannedCase:
    case: Case
    skip_reason: str | None = None


def max_ranks(cpu_max_ranks: int) -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else cpu_max_ranks


def skip_reason(case: Case, rank_limit: int) -> str | None:
    """Why this case cannot or must not run here, decided before anything launches; None if it runs."""
    spec = get_spec(case.model)
    layout = case.layout
    if layout.world_size > rank_limit:
        where = "GPUs" if torch.cuda.is_available() else "ranks allowed on CPU (cpu_max_ranks)"
        return f"needs {layout.world_size} ranks; this machine has {rank_limit} {where}"
    model_class = spec.model_class()
    if layout.is_context_parallel and getattr(model_class, "_cp_plan", None) is None:
        return f"{spec.class_name} defines no _cp_plan"
    if layout.tp > 1 and getattr(model_class, "_tp_plan", None) is None:
        return f"{spec.class_name} defines no _tp_plan"
    if layout.is_context_parallel and not backend_info.supports_context_parallel(case.backend):
        return f"diffusers does not register backend {case.backend!r} as context-parallel capable"
    if case.kind == "image" and importlib.util.find_spec("transformers") is None:
        return "image cases need the `transformers` package (diffusers' pipeline classes import it)"
    return backend_info.unavailable_reason(case.backend, case.dtype)


def shapes_for(spec, wanted) -> list[str]:
    """The spec's shapes among `wanted` (or all of them); a model without a shape simply has no such case."""
    return list(spec.shapes) if "all" in wanted else [name for name in wanted if name in spec.shapes]


def build_plan(models, layouts, backends, dtypes, shapes=("default",), cpu_max_ranks: int = 4,
               fault: str | None = None, kinds=("tensor",), weights_dir=None) -> list[PlannedCase]:
    """Every case, in a stable order; what cannot run here carries its SKIP reason. Image cases exist for the models
    with a tiny pipeline, at the tiny pipeline's own size, or on the local checkpoint `weights_dir`."""
    for dtype in dtypes:
        torch_dtype(dtype)
    if fault is not None:
        faults.check(fault)
    known_backends = set(backend_info.all_backend_names())
    for backend in backends:
        if backend not in known_backends:
            raise HarnessError(f"unknown backend {backend!r}; valid backends: {', '.join(sorted(known_backends))}")
    parsed = [parse_layout(name) for name in layouts]
    specs = [get_spec(name) for name in models]
    known_shapes = {name for spec in specs for name in spec.shapes} | {"all"}
    if set(shapes) - known_shapes:
        raise HarnessError(f"unknown shape(s) {sorted(set(shapes) - known_shapes)}; valid shapes of these models: "
                           f"{', '.join(sorted(known_shapes))}")
    unknown_kinds = set(kinds) - {"tensor", "image"}
    if unknown_kinds:
        raise HarnessError(f"unknown kind(s) {sorted(unknown_kinds)}; valid kinds: tensor, image")
    limit = max_ranks(cpu_max_ranks)
    plan = []
    for spec in specs:
        for kind, shape in _kind_shapes(spec, kinds, shapes, weights_dir):
            for layout, backend, dtype in product(parsed, backends, dtypes):
                case = Case(spec.name, layout, backend, dtype, kind=kind, shape=shape, fault=fault)
                plan.append(PlannedCase(case, skip_reason(case, limit)))
    return plan


def _kind_shapes(spec, kinds, shapes, weights_dir) -> list[tuple[str, str]]:
    from harness.image_runs import has_pipeline, weights_tag

    pairs = [("tensor", shape) for shape in shapes_for(spec, shapes)] if "tensor" in kinds else []
    if "image" in kinds and has_pipeline(spec.name):
        pairs.append(("image", "default" if weights_dir is None else weights_tag(weights_dir)))
    return pairs


def uncovered_rows() -> list[PlannedCase]:
    """A SKIP row for every class of the installed diffusers with a parallel plan but no harness spec, so a model
    that gains `_cp_plan` or `_tp_plan` upstream is visible in the matrix the day it lands."""
    from harness.layouts import Layout
    from harness.zoo import NOT_COVERED
    from harness.zoo.discover import parallel_classes

    rows = []
    for row in parallel_classes():
        if row["spec"] is None:
            reason = NOT_COVERED.get(row["class_name"], "no harness spec yet (add one under harness/zoo/)")
            case = Case(row["class_name"], Layout("-"), "-", "-")
            rows.append(PlannedCase(case, f"not covered: {row['class_name']} has a parallel plan; {reason}"))
    return rows
