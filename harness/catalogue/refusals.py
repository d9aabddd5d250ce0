"""What diffusers must refuse when a user hands `enable_parallelism` something invalid: a parallel config it cannot
honour, a `_cp_plan` that names no module, no input or no output, or a `_tp_plan` it cannot resolve. Each is a
mistake a user writing a script or a model's plan makes (a degree of 1 from a loop over degrees, a typo in a plan's
key, `enable_parallelism` called twice), and each has a refusal in diffusers with its message. A refusal that goes
missing does not crash: it runs a plan that silently leaves an input whole or a module ungathered, the failures seen
in the field.

An invalid input is tried only where the installed release carries its refusal: its message is read from the
module's own source (releases differ), and one whose module does not say it is not tried (the case says which). The
`refusal` kind (harness.kinds.refusal) tries each on a fresh model, the way a user would, and expects the refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CP, TP = "cp", "tp"  # the layouts an invalid input is tried on: context-parallel or tensor-parallel ones


@dataclass
class Attempt:
    """What an invalid input is tried with: a fresh build of the case (`fresh()`: its model and its run), the case's
    layout, the launch's device mesh and the case's model plan (None: the class's own `_cp_plan`)."""

    fresh: Callable[[], Any]
    layout: Any
    mesh: Any
    cp_plan: dict | None

    def config(self):
        """The layout's own valid config, as the case builds it."""
        return self.layout.diffusers_config(self.mesh)

    def plan(self, model) -> dict:
        """The case's model plan ({} for a model without one: a tensor-parallel model may have none)."""
        return dict(self.cp_plan if self.cp_plan is not None else model._cp_plan or {})


@dataclass(frozen=True)
class Invalid:
    name: str
    what: str  # for people: what the user handed diffusers
    family: str  # CP or TP: the layouts it is tried on
    message: str  # a text of diffusers' refusal, as its module's source carries it
    module: str  # the diffusers module that refuses it
    attempt: Callable[[Attempt], None]  # what the user does; returns when diffusers accepted it
    needs: str = ""  # a diffusers feature (harness.core.compat) without which it cannot even be written
    applies: Callable[[dict], bool] = lambda plan: True  # whether the model's plan has what it changes


def _cp_config(**options):
    import diffusers

    return diffusers.ContextParallelConfig(**options)


def _tp_config(**options):
    import diffusers

    return diffusers.TensorParallelConfig(**options)


def _degree_over_world(attempt: Attempt) -> None:
    import torch.distributed as dist

    config = _cp_config(ulysses_degree=2 * dist.get_world_size(), mesh=attempt.mesh)
    attempt.fresh().module.enable_parallelism(config=config, cp_plan=attempt.cp_plan)


def _no_plan(attempt: Attempt) -> None:
    model = attempt.fresh().module
    model._cp_plan = None  # a model class without a plan, and none given
    model.enable_parallelism(config=attempt.config())


def _enabled_twice(attempt: Attempt) -> None:
    model = attempt.fresh().module
    model.enable_parallelism(config=attempt.config(), cp_plan=attempt.cp_plan)
    model.enable_parallelism(config=attempt.config(), cp_plan=attempt.cp_plan)


def _with_plan(change: Callable[[dict], dict], run: bool = False) -> Callable[[Attempt], None]:
    """The attempt that enables a fresh model with its own plan changed by `change` (and runs it when `run`)."""
    def attempt(tried: Attempt) -> None:
        built = tried.fresh()
        plan = change(tried.plan(built.module))
        built.module.enable_parallelism(config=tried.config(), cp_plan=plan)
        if run:
            built.run()

    return attempt


def _with_tp_plan(change: Callable[[dict, Any], dict | None]) -> Callable[[Attempt], None]:
    """The attempt that enables a fresh model's tensor parallelism with its `_tp_plan` changed by `change`, as a
    user writing a model's plan would hand it (the model's own attribute: `enable_parallelism` takes no TP plan)."""
    def attempt(tried: Attempt) -> None:
        model = tried.fresh().module
        model._tp_plan = change(dict(model._tp_plan), model)
        model.enable_parallelism(config=tried.config())

    return attempt


def _not_a_list(model) -> str:
    """The name of the model's first child that is not a ModuleList (its embedder, its output projection)."""
    import torch

    return next(name for name, child in model.named_children() if not isinstance(child, torch.nn.ModuleList))


def _inputs_entry(plan: dict) -> str | None:
    """The key of the plan's first entry that splits inputs by name."""
    return next((key for key, entry in plan.items() if isinstance(entry, dict)
                 and any(isinstance(name, str) for name in entry)), None)


def _misspelt_input(plan: dict) -> dict:
    from diffusers.models._modeling_parallel import ContextParallelInput

    key = _inputs_entry(plan)
    first = next(name for name in plan[key] if isinstance(name, str))
    typo = first[:-1] if first.endswith("s") else first + "s"  # `hidden_state` for `hidden_states`
    return {**plan, key: {**plan[key], typo: ContextParallelInput(split_dim=1, expected_dims=3)}}


def _split_outputs_entry(plan: dict) -> str | None:
    """The key of the plan's first entry that splits a module's outputs by index (a RoPE module's cos and sin)."""
    return next((key for key, entry in plan.items() if isinstance(entry, dict) and entry
                 and all(isinstance(index, int) for index in entry)), None)


def _output_past_the_end(plan: dict) -> dict:
    key = _split_outputs_entry(plan)
    entry = plan[key]
    return {**plan, key: {**entry, max(entry) + 1: entry[max(entry)]}}


def _gather_entry(plan: dict) -> str | None:
    from diffusers.models._modeling_parallel import ContextParallelOutput

    return next((key for key, entry in plan.items() if isinstance(entry, ContextParallelOutput)), None)


def _gather_two(plan: dict) -> dict:
    key = _gather_entry(plan)
    return {**plan, key: [plan[key], plan[key]]}  # the gathered module returns one tensor


def _split_as_gather(plan: dict) -> dict:
    from diffusers.models._modeling_parallel import ContextParallelInput

    key = _gather_entry(plan)
    return {**plan, key: [ContextParallelInput(split_dim=1, expected_dims=3)]}


def _has_gather(plan: dict) -> bool:
    return _gather_entry(plan) is not None


_CP_PARALLEL = "diffusers.models._modeling_parallel"
_HOOKS = "diffusers.hooks.context_parallel"
_TP_HOOKS = "diffusers.hooks.tensor_parallel"
_MODELING = "diffusers.models.modeling_utils"

INVALID: tuple[Invalid, ...] = (
    Invalid("degrees_both_one", "ContextParallelConfig(ring_degree=1, ulysses_degree=1)", CP,
            "Either ring_degree or ulysses_degree must be greater than 1", _CP_PARALLEL,
            lambda tried: _cp_config(ring_degree=1, ulysses_degree=1)),
    Invalid("degree_zero", "ContextParallelConfig(ring_degree=2, ulysses_degree=0)", CP,
            "must be greater than or equal to 1", _CP_PARALLEL,
            lambda tried: _cp_config(ring_degree=2, ulysses_degree=0)),
    Invalid("ulysses_anything_without_ulysses", "ContextParallelConfig(ring_degree=2, ulysses_anything=True)", CP,
            "ulysses_degree must be greater than 1 for ulysses_anything", _CP_PARALLEL,
            lambda tried: _cp_config(ring_degree=2, ulysses_anything=True), needs="ulysses_anything"),
    Invalid("ring_anything_without_ring", "ContextParallelConfig(ulysses_degree=2, ring_anything=True)", CP,
            "ring_degree must be greater than 1 for ring_anything", _CP_PARALLEL,
            lambda tried: _cp_config(ulysses_degree=2, ring_anything=True), needs="ring_anything"),
    Invalid("ring_anything_with_ulysses", "ContextParallelConfig(ring_degree=2, ulysses_degree=2, ring_anything=True)",
            CP, "ring_anything cannot be enabled when ulysses_degree > 1", _CP_PARALLEL,
            lambda tried: _cp_config(ring_degree=2, ulysses_degree=2, ring_anything=True), needs="ring_anything"),
    Invalid("degree_over_world", "a ContextParallelConfig of twice the world's degree on the world's mesh", CP,
            "must not exceed the world size", _CP_PARALLEL, _degree_over_world, needs="cp_mesh"),
    Invalid("tp_degree_zero", "TensorParallelConfig(tp_degree=0)", TP, "`tp_degree` must be >= 1", _CP_PARALLEL,
            lambda tried: _tp_config(tp_degree=0)),
    Invalid("tp_no_plan", "tensor parallelism on a model without a `_tp_plan`", TP,
            "`_tp_plan` must be set on the model class", _TP_HOOKS, _with_tp_plan(lambda plan, model: None)),
    Invalid("tp_plan_two_wildcards", "a `_tp_plan` key with two wildcards (`transformer_blocks.*.attn.*`)", TP,
            "can only be used once in a `_tp_plan` key", _TP_HOOKS,
            _with_tp_plan(lambda plan, model: {**plan, "transformer_blocks.*.attn.*": "colwise"})),
    Invalid("tp_plan_wildcard_not_list", "a `_tp_plan` key with a wildcard over a module that is not a ModuleList",
            TP, "must expand over a `ModuleList`", _TP_HOOKS,
            _with_tp_plan(lambda plan, model: {**plan, f"{_not_a_list(model)}.*": "colwise"})),
    Invalid("tp_plan_unknown_style", "a `_tp_plan` style diffusers does not know (`diagonal`)", TP,
            "Unsupported tensor-parallel style", _TP_HOOKS,
            _with_tp_plan(lambda plan, model: {**plan, next(iter(plan)): "diagonal"})),
    Invalid("no_plan", "enable_parallelism on a model without a `_cp_plan`, and no cp_plan given", CP,
            "must be provided either as an argument or set in the model's `_cp_plan`", _MODELING, _no_plan),
    Invalid("enabled_twice", "enable_parallelism called twice on one model", CP,
            "Parallelism is already applied to this", _MODELING, _enabled_twice),
    Invalid("plan_unknown_module", "a `_cp_plan` key naming no submodule (`proj_outt`)", CP, "is not a submodule of",
            _HOOKS, _with_plan(lambda plan: {**plan, "proj_outt": plan[_gather_entry(plan)]}), applies=_has_gather),
    Invalid("plan_two_wildcards", "a `_cp_plan` key with two wildcards (`transformer_blocks.*.*`)", CP,
            "can only be used once in the name", _HOOKS,
            _with_plan(lambda plan: {**plan, "transformer_blocks.*.*": plan[_gather_entry(plan)]}),
            applies=_has_gather),
    Invalid("plan_wildcard_not_list", "a `_cp_plan` key with a wildcard over a module that is not a ModuleList "
                                      "(`*` over the model)", CP, "can only be used with ModuleList", _HOOKS,
            _with_plan(lambda plan: {**plan, "*": plan[_gather_entry(plan)]}), applies=_has_gather),
    Invalid("plan_entry_type", "a `_cp_plan` entry that is a string", CP,
            "Unsupported context parallel model plan type", _HOOKS,
            _with_plan(lambda plan: {**plan, _gather_entry(plan): "gather"}), applies=_has_gather),
    Invalid("plan_split_as_gather", "a ContextParallelInput where the `_cp_plan` gathers outputs", CP,
            "Expected all elements of cp_model_plan to be CPOutput", _HOOKS, _with_plan(_split_as_gather),
            applies=_has_gather),
    Invalid("plan_unknown_input", "a `_cp_plan` input named after no argument of forward (a misspelt name)", CP,
            "not found in", _HOOKS, _with_plan(_misspelt_input, run=True),
            applies=lambda plan: _inputs_entry(plan) is not None),
    Invalid("plan_output_past_the_end", "a `_cp_plan` splitting an output index the module does not return", CP,
            "out of bounds for output of length", _HOOKS, _with_plan(_output_past_the_end, run=True),
            applies=lambda plan: _split_outputs_entry(plan) is not None),
    Invalid("plan_gather_count", "a `_cp_plan` gathering two outputs of a module that returns one", CP,
            "Expected output to have", _HOOKS, _with_plan(_gather_two, run=True), applies=_has_gather),
)


def _source(module: str) -> str:
    from harness.core import compat

    return compat.source_of(module)


def not_tried(invalid: Invalid, plan: dict) -> str | None:
    """Why `invalid` is not tried on this release and model (None: it is)."""
    from harness.core import compat

    if invalid.needs and not compat.has(invalid.needs):
        return f"this diffusers has no {compat.FEATURES[invalid.needs].what}"
    if invalid.message not in _source(invalid.module):
        return f"this diffusers has no such refusal ({invalid.message!r} is not in {invalid.module})"
    if not invalid.applies(plan):
        return "the model's plan has nothing this changes"
    return None


def for_layout(layout) -> tuple[Invalid, ...]:
    """The invalid inputs tried on `layout`: the context-parallel ones on diffusers' CP layouts, the
    tensor-parallel ones on TP layouts."""
    family = CP if layout.is_context_parallel else TP if layout.tp > 1 else None
    return tuple(invalid for invalid in INVALID if invalid.family == family)
