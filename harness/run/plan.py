"""The plan: models x shapes x layouts x backends x dtypes, with what cannot run decided up front: SKIP where it could
run elsewhere (CUDA only, a package missing, too many ranks), N/A where the combination cannot exist (a `NotApplicable`
reason: harness.core.applicability)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path

from harness import faults, flows
from harness.catalogue import predictions
from harness.catalogue.predictions import Refusal
from harness.catalogue.zoo import SPECS, get_spec
from harness.core import axes, compat
from harness.core.applicability import NotApplicable
from harness.core.dtypes import torch_dtype
from harness.core.errors import HarnessError
from harness.core.layouts import Layout, parse_layout
from harness.core.modes import EAGER, mode_of
from harness.core.records import Case
from harness.flows import scope as flow_scope
from harness.kinds import KINDS, kind_of
from harness.loads import ENABLE, load_of
from harness.rank import backends as backend_info
from harness.rank import cpu as cpu_shims
from harness.run import launchers
from harness.run.launchers import Capacity


@dataclass(frozen=True)
class PlannedCase:
    case: Case
    skip_reason: str | None = None  # a `NotApplicable` one makes the case N/A, any other SKIP
    expected_refusal: Refusal | None = None  # the case runs, and diffusers refusing it with this text is XFAIL
    plan_error: str | None = None  # known before launch to be broken (a probe that must succeed failed): ERROR

    @property
    def runs(self) -> bool:
        return self.skip_reason is None and self.plan_error is None


def max_ranks(cpu_max_ranks: int, nnodes: int = 1, gpus_per_node: int = 0) -> Capacity:
    """How many ranks fit: on GPUs nodes x devices per node, on CPU `cpu_max_ranks` (harness.run.launchers)."""
    return launchers.capacity(cpu_max_ranks, nnodes, gpus_per_node)


def skip_reason(case: Case, rank_limit: int | Capacity) -> str | None:
    """Why this case cannot or must not run here, decided before anything launches; None if it runs. A reason that
    the combination cannot exist is a `NotApplicable` (N/A); what could run elsewhere stays plain text (SKIP)."""
    spec = get_spec(case.model)
    layout = case.layout
    limit = max_ranks(rank_limit) if isinstance(rank_limit, int) else rank_limit
    too_big = limit.skip_reason(layout.world_size)
    if too_big is not None:
        return too_big
    missing = compat.model_class_missing(spec.class_name) or compat.layout_missing(layout)
    if missing is not None:  # a class or parallel feature this diffusers release does not have yet
        return NotApplicable(missing)
    if layout.is_torch_context_parallel:
        unfit = torch_cp_unfit(case)
        if unfit is not None:
            return unfit
    model_class = spec.model_class()
    if layout.is_context_parallel and getattr(model_class, "_cp_plan", None) is None:
        return NotApplicable(f"{spec.class_name} defines no _cp_plan")
    if layout.tp > 1 and getattr(model_class, "_tp_plan", None) is None:
        return NotApplicable(f"{spec.class_name} defines no _tp_plan")
    kind = kind_of(case.kind)
    unavailable = kind.unavailable() or kind.skip_reason(case) or mode_skip(case, model_class) or \
        predictions.load_skip(case) or flow_scope.unavailable(case, model_class)
    if unavailable is not None:
        return unavailable
    found = backend_info.probe(case.backend, case.dtype)
    return None if found.broken else found.reason  # a broken backend is not a SKIP: see `_planned`


def torch_cp_unfit(case: Case) -> str | None:
    """Why PyTorch's context parallelism (a tcp layout, harness.rank.torch_cp) cannot run this case; None if it can.
    A kind that does not run under it yet is a SKIP; a model, backend or split it cannot hold is N/A."""
    spec, kind, degree = get_spec(case.model), kind_of(case.kind), case.layout.torch_cp
    if not kind.torch_context_parallel:
        return f"PyTorch's context parallelism: the {case.kind} kind does not run under context_parallel yet"
    if spec.torch_cp_buffers is None:
        return NotApplicable(f"PyTorch's context parallelism: {spec.name}: {spec.torch_cp_unfit}")
    if case.backend != "native":
        return NotApplicable(f"PyTorch's context parallelism replaces F.scaled_dot_product_attention, which of "
                             f"diffusers' backends only native calls ({case.backend} would run beside the ring, not "
                             f"through it)")
    lengths = kind.split_lengths(case) or {}
    uneven = [f"{name} {length}" for name, length in lengths.items() if length % degree]
    if uneven:
        return NotApplicable(f"PyTorch's context parallelism: {', '.join(uneven)} not divisible by the degree "
                             f"{degree} (its ring exchanges equal K/V chunks)")
    return None


def mode_skip(case: Case, model_class) -> str | None:
    """Why a compiled mode cannot run this case, or None: N/A where there is nothing to compile it with (a kind that
    never compiles, regional compilation without repeated blocks), SKIP where only this machine stands in the way.
    A flow that compiles the model itself (`Flow.compiles`) is asked as its mode, and runs in eager mode only."""
    compiling = flows.compiled_by(case.flow)
    if compiling and mode_of(case.mode).backend is not None:
        return NotApplicable(f"the {case.flow} flow compiles the model itself: the {case.mode} mode would compile it "
                             f"again")
    mode = mode_of(flows.compiling_mode(case))
    if mode.backend is None:
        return None
    if not kind_of(case.kind).compiles:
        return NotApplicable(f"the {case.kind} kind does not run compiled (its `compiles` is False)")
    if mode.regional and not hasattr(model_class, "compile_repeated_blocks"):
        return NotApplicable("this diffusers has no compile_repeated_blocks (regional compilation)")
    if mode.regional and not getattr(model_class, "_repeated_blocks", None):
        return NotApplicable(f"{model_class.__name__} declares no _repeated_blocks (diffusers' "
                             f"compile_repeated_blocks needs them)")
    if case.layout.is_torch_context_parallel and cpu_shims.needed():
        return ("compiled under PyTorch's context parallelism on CPU: the CPU shim's ring (harness.rank.cpu) runs gloo "
                "collectives that Dynamo cannot trace (\"Cannot access data pointer of Tensor\"); on CUDA it is "
                "planned (untried: no GPU lent)")
    return None


def expected_refusal(case: Case) -> Refusal | None:
    """What diffusers is expected to refuse for the case: its flow's guard where the installed release carries it
    (harness.flows), else the catalogue's prediction (harness.catalogue.predictions), asked with its kind's split
    lengths and diffusers' registry of context-parallel capable backends."""
    refused = flow_scope.refusal(case)
    if refused is not None:
        return Refusal(refused[0], (refused[1],), checked=True)
    return predictions.predicted_refusal(case, kind_of(case.kind).split_lengths, backend_info.supports_context_parallel)


def check_weights(folder: str | None) -> None:
    """`--weights` names a diffusers pipeline folder, checked before anything is planned or captured after it (not
    when the options are read: a Slurm submission names a folder of the compute nodes)."""
    if folder is None:
        return
    path = Path(folder).expanduser()
    what = "the folder of a diffusers pipeline saved with `save_pretrained` (it holds model_index.json)"
    if not path.is_dir():
        raise HarnessError(f"option weights: {folder} {'is not a folder' if path.exists() else 'does not exist'}; "
                           f"give {what}")
    if not (path / "model_index.json").is_file():
        raise HarnessError(f"option weights: {folder} has no model_index.json; give {what}")


def check_inputs(scopes: dict, kinds, backends, dtypes, fault: str | None, weights_dir, more: dict) -> None:
    """Every value a plan is asked for, checked before a case is made: a HarnessError naming the first unknown one
    (a `--weights` folder, dtype, fault, mode, load, backend, layout, model, shape or kind, or an axis the plan
    crosses that is not declared) and the valid ones. `scopes`: {kind: (models, layouts, shapes)}."""
    check_weights(weights_dir)
    for dtype in dtypes:
        torch_dtype(dtype)
    if fault is not None:
        faults.check(fault)
    for mode in more.get("mode", ()):
        mode_of(mode)
    for load in more.get("load", ()):
        load_of(load)
    for flow in more.get("flow", ()):
        flows.value_of(flow)
    known_backends = set(backend_info.all_backend_names())
    for backend in backends:
        if backend not in known_backends:
            raise HarnessError(f"unknown backend {backend!r}; valid backends: {', '.join(sorted(known_backends))}")
    for layout in (name for scope in scopes.values() for name in scope[1]):
        parse_layout(layout)
    for model in (name for scope in scopes.values() for name in scope[0]):
        get_spec(model)
    known_shapes = {name for spec in SPECS.values() for name in spec.shapes} | {"all"}
    asked = {shape for scope in scopes.values() for shape in scope[2]}
    if asked - known_shapes:  # a known shape runs on the models that have it
        raise HarnessError(f"unknown shape(s) {sorted(asked - known_shapes)}; valid shapes: "
                           f"{', '.join(sorted(known_shapes))}")
    unknown_kinds = set(kinds) - set(KINDS)
    if unknown_kinds:
        raise HarnessError(f"unknown kind(s) {sorted(unknown_kinds)}; valid kinds: {', '.join(KINDS)}")
    crossed = {"backend", "dtype", *(axis.name for axis in axes.product_axes() if axis.default is not None), *more}
    if crossed != {axis.name for axis in axes.product_axes()}:
        raise HarnessError(f"the plan crosses {sorted(crossed)}; the declared axes are "
                           f"{sorted(axis.name for axis in axes.product_axes())}")


def build_plan(models, layouts, backends, dtypes, shapes=("default",), cpu_max_ranks: int | None = None,
               fault: str | None = None, kinds=("tensor",), weights_dir=None,
               check_refusals: bool = False, scopes: dict | None = None,
               capacity: Capacity | None = None, more: dict[str, list] | None = None,
               compile_cases=("*",), load_cases=("*",), flow_cases=("*",)) -> list[PlannedCase]:
    """Every case, in a stable order; what cannot run here carries its SKIP reason. Image cases exist for the models
    with a tiny pipeline, at the tiny pipeline's own size, or on the local checkpoint `weights_dir`. A kind runs the
    layouts it applies to (data-parallel layouts: train only), on its own models, layouts and shapes where `scopes`
    gives them ({kind: (models, layouts, shapes)}).

    A case diffusers is expected to refuse is a SKIP with the reason, or, with `check_refusals`, runs so that the
    refusal is seen (XFAIL) and a backend that runs where it should refuse is judged like any other case. `more`:
    the values of the product axes declared after backend and dtype (harness.core.axes), by axis name (one not
    given: its default). A compiled mode runs only the cases whose id without the mode matches a glob of
    `compile_cases` (each plan's compile slice: compiling costs tens of seconds a graph), and a load other than
    `enable` those whose id without the load matches a glob of `load_cases` (each plan's load slice); a load
    exists only on the layouts it applies to (the `tp_*` combinations: tensor-parallel layouts). A flow other than
    `none` runs the cases whose id without load, flow and mode matches a glob of `flow_cases`, where it exists."""
    scopes = {kind: (scopes or {}).get(kind, (models, layouts, shapes)) for kind in kinds}
    check_inputs(scopes, kinds, backends, dtypes, fault, weights_dir, more or {})
    parsed = {name: parse_layout(name) for scope in scopes.values() for name in scope[1]}
    specs = [get_spec(name) for name in dict.fromkeys(name for scope in scopes.values() for name in scope[0])]
    if cpu_max_ranks is None:
        from harness.run.settings import OPTIONS

        cpu_max_ranks = OPTIONS["cpu_max_ranks"].default
    limit = capacity or max_ranks(cpu_max_ranks)
    registry = backend_info.registry_problems()  # checked against the catalogue once per plan
    defaults = {axis.name: [axis.default] for axis in axes.product_axes() if axis.default is not None}
    crossed = {"backend": list(backends), "dtype": list(dtypes), **defaults, **(more or {})}  # not given: default
    compiled, loaded, flowed = Globs(compile_cases), Globs(load_cases), Globs(flow_cases)
    sliced = ["load", "flow", "mode"]  # the product's last axes (harness.core.axes), each with a slice of its own
    if list(crossed)[-len(sliced):] != sliced:
        raise HarnessError(f"the plan's product ends with {list(crossed)[-len(sliced):]}, not {sliced}")
    head = {name: values for name, values in crossed.items() if name not in sliced}
    plan = []
    for spec in specs:
        for kind in (name for name in KINDS if name in kinds and spec.name in scopes[name][0]):
            kind_layouts = [parsed[name] for name in scopes[kind][1] if kind_of(kind).applies(parsed[name])]
            for shape, folder in kind_of(kind).shapes(spec, list(scopes[kind][2]), weights_dir):
                for layout, *values in product(kind_layouts, *head.values()):
                    base = Case(spec.name, layout, kind=kind, shape=shape, fault=fault, weights_dir=folder,
                                **dict(zip(head, values, strict=True)))
                    plan.extend(_planned(case, limit, check_refusals, registry)
                                for case in _sliced(base, crossed, compiled, loaded, flowed))
    return plan


def _sliced(base: Case, crossed: dict, compiled: Globs, loaded: Globs, flowed: Globs):
    """The cases of `base` over the loads, flows and modes of the product, in its order: a load other than `enable`
    where it applies and in the load slice, a flow other than `none` where it exists and in the flow slice, a compiled
    mode in the compile slice. Each slice is asked once for what decides it (the flow slice: the base case; the load
    slice: its flow; the compile slice: its load and flow), so a case outside them costs nothing."""
    in_flow_slice = any(flow != flows.NONE for flow in crossed["flow"]) and \
        flowed.match(base, load=ENABLE, flow=flows.NONE, mode=EAGER)
    in_load_slice: dict[str, bool] = {}
    for load in crossed["load"]:
        if load != ENABLE and not load_of(load).applies(base.layout):
            continue
        for flow in crossed["flow"] if in_flow_slice else [flow for flow in crossed["flow"] if flow == flows.NONE]:
            case = replace(base, load=load, flow=flow)
            if flow != flows.NONE and not flow_scope.exists(case, load_of(load).checkpoint):
                continue
            if load != ENABLE:
                if flow not in in_load_slice:
                    in_load_slice[flow] = loaded.match(case, load=ENABLE, mode=EAGER)
                if not in_load_slice[flow]:
                    continue
            in_compile_slice = None
            for mode in crossed["mode"]:
                if mode != EAGER:
                    if in_compile_slice is None:
                        in_compile_slice = compiled.match(case, mode=EAGER)
                    if not in_compile_slice:
                        continue
                moded = replace(case, mode=mode)
                if kind_of(moded.kind).crosses(moded):
                    yield moded


class Globs:
    """A slice's globs over case ids (`compile_cases`, `load_cases`, `flow_cases`), matched against a case's id with
    some axes set back to their plain values: the id spelled once from the case's values, a glob without wildcards
    (most: a slice lists ids) looked up in a set."""

    def __init__(self, globs):
        self.ids = {glob for glob in globs if not any(char in glob for char in "*?[")}
        self.patterns = [glob for glob in globs if glob not in self.ids]

    def match(self, case: Case, **plain: str) -> bool:
        """Whether the id of `case` without its fault, with the axes in `plain` at those values, is in the slice."""
        text = axes.spell({**case.axis_values(), **plain})
        return text in self.ids or any(fnmatch.fnmatchcase(text, glob) for glob in self.patterns)


def _planned(case: Case, limit: int, check_refusals: bool, registry: dict[str, str]) -> PlannedCase:
    reason = skip_reason(case, limit)
    if reason is None and case.backend in registry:  # the function the name holds cannot be proven: no verdict
        return PlannedCase(case, plan_error=registry[case.backend])
    if reason is None and case.backend != "-":
        found = backend_info.probe(case.backend, case.dtype)
        if found.broken:
            return PlannedCase(case, plan_error=found.reason)
    refusal = expected_refusal(case) if reason is None else None
    if refusal is not None and not check_refusals and not refusal.checked:  # diffusers refuses the combination: N/A
        return PlannedCase(case, NotApplicable(f"{refusal.reason}; --check-refusals runs it to see diffusers refuse"))
    return PlannedCase(case, reason, refusal)


def uncovered_rows() -> list[PlannedCase]:
    """A SKIP row for every class of the installed diffusers with a parallel plan but no harness spec, so a model
    that gains `_cp_plan` or `_tp_plan` upstream is visible in the matrix the day it lands; an ERROR row for every
    transformer module that does not even import here (its classes could not be looked at)."""
    from harness.catalogue.zoo import NOT_COVERED
    from harness.catalogue.zoo.discover import import_failures, parallel_classes

    rows = []
    for row in parallel_classes():
        if row["spec"] is None:
            reason = NOT_COVERED.get(row["class_name"], "no harness spec yet (add one under harness/catalogue/zoo/)")
            case = Case(row["class_name"], Layout("-"), "-", "-")
            rows.append(PlannedCase(case, f"not covered: {row['class_name']} has a parallel plan; {reason}"))
    for module, error in import_failures():
        case = Case(module.rsplit(".", 1)[-1], Layout("-"), "-", "-")
        rows.append(PlannedCase(case, plan_error=f"could not import {module}: {error}"))
    return rows
