"""The flows' registry: what users do around `enable_parallelism` (the `flow` axis, harness.core.axes).

A flow is one user call, or a short sequence, made on the case's model at a position: before parallelism is turned
on (the flow's own name, `lora`) or after it (`lora_after`). Each is registered by `@flow` on its own code, as the
faults are (harness.faults.registry), with what it needs, where it exists and what diffusers refuses of it; the plan,
the rank and the report read this registry and nothing else names a flow. Torch-free: each flow imports torch and
diffusers inside its body.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from harness.core.errors import HarnessError
from harness.core.registry import Registry

NONE = "none"  # the default flow: nothing called around enable_parallelism (left out of case ids)
SUFFIX = "_after"  # what an axis value of the "after" position ends with
BEFORE, AFTER = "before", "after"  # the positions: before enable_parallelism, after it
# What a flow case is judged against: the same calls on one device in this dtype, whatever the case's own
# (harness.engine.casework.flow_reference); so what the calls did is held to this dtype's limit (harness.run.verdict)
ONE_DEVICE_DTYPE = "fp32"


def on_layouts(family: str, layout) -> bool:
    """Whether `layout` is of the family a flow or a refusal names: "tp", "cp" or "any" parallel layout, or "all"
    (one device too: a refusal of the model, whatever its layout)."""
    return {"tp": layout.tp > 1, "cp": layout.is_context_parallel, "any": layout.world_size > 1,
            "all": True}[family]


@dataclass(frozen=True)
class Refused:
    """What diffusers refuses of a flow at a position, on which layouts: a text of its error, which the installed
    module's source must carry for the refusal to be expected (a release without it runs the flow and is judged on
    its numbers)."""

    position: str  # before or after
    layouts: str  # "tp": tensor-parallel layouts, "cp": context-parallel ones, "any" parallel one, "all"
    error: str  # a text of diffusers' message
    module: str  # the diffusers module whose source carries it
    where: str  # the check, for people

    def on(self, layout) -> bool:
        return on_layouts(self.layouts, layout)


@dataclass(frozen=True)
class Setting:
    """What a flow's call is given besides the model: the rank's device, the case's backend and dtype, the
    parallel config and `cp_plan` the case enables (None on one device), the pipeline the model runs in where the
    case's kind runs one (image: a pipeline's own calls, `enable_model_cpu_offload`; None otherwise), and the case's
    denoising loop where it runs one."""

    device: object
    backend: str
    dtype: object
    config: object | None = None
    cp_plan: dict | None = None
    pipeline: object | None = None
    denoising: object | None = None  # the case's denoising loop (harness.flows.denoising) for a flow with `steps`
    # what a flow that compiles (`Flow.compiles`) gives torch.compile: Inductor, as users compile; on a rank, the
    # harness's reader of every graph handed to it, which compiles them by Inductor (harness.rank.compiled)
    compile_backend: object = "inductor"


CHANGES, KEEPS = "changes", "keeps"  # what a call must do to one device's output (`Call.effect`)


@dataclass(frozen=True)
class Call:
    """One call a flow makes, as a user writes it, and what it must do to one device's output: CHANGES it beyond
    the kind's limit from the output before the call, KEEPS it within that limit, or None: not judged on one run (a
    cache's, which decides per step: its loop's record judges it)."""

    text: str
    effect: str | None = None


@dataclass(frozen=True)
class Equivalent:
    """The model a flow's calls must give, reached another way on a fresh one-device build (a hot swap: the second
    LoRA loaded directly): `code(module, setting)`, or None for the plain model (an unload gives it back); or, for a
    flow whose loop guides (`per_context`), the flow's own calls on a model of its own for each branch of the loop,
    so that no branch can see another's state (a cache keeps a state per cache context)."""

    text: str
    code: Callable | None = None
    per_context: bool = False


@dataclass(frozen=True)
class Flow:
    name: str
    calls: tuple[Call, ...]  # what it calls, in order: its code yields after each (harness.flows.calls)
    code: Callable  # code(module, setting) on the case's model (`Setting`): a generator of one step per call, or a
    # function for a flow of one call
    equals: Equivalent | None = None  # one device after the calls must equal this (None: nothing to hold it to)
    layouts: str = "any"  # the layouts it exists on: "cp", "tp" or "any" parallel layout (one device runs it too)
    positions: tuple[str, ...] = (BEFORE, AFTER)
    needs: tuple[str, ...] = ()  # importable packages (a plan-time SKIP without them)
    needs_api: tuple[str, ...] = ()  # methods the model class must have on the installed release (else N/A)
    # methods the pipeline the model runs in must have (the zoo's pipeline of the model: a loader users call on the
    # pipeline, such as load_ip_adapter); else N/A
    pipeline_api: tuple[str, ...] = ()
    refused: tuple[Refused, ...] = ()
    kinds: tuple[str, ...] = ("tensor",)  # the case kinds it runs on (harness.kinds: each kind's `flow_slice`)
    needs_accelerator: bool = False  # it moves weights between the CPU and an accelerator: SKIP on a CPU-only machine
    steps: int = 0  # its case runs a denoising loop of this many steps (it decides per step: a cache); 0: one forward
    # the positions the quick plan runs (the full plan and `--flows all` run every one); a position left out is a
    # finding no entry can excuse yet, said where it is declared
    quick: tuple[str, ...] = (BEFORE, AFTER)
    # the quick plan compiles it too, before enable_parallelism (a proof path of its own under torch.compile: a LoRA's
    # layers, a cast's graph breaks, a cache's steps that run outside the graphs)
    quick_compiled: bool = False
    # what a user passes with every call once the flow's calls are made (an IP-Adapter's image embeddings), per kind:
    # the transformer's forward (tensor) or the pipeline's call (image); each inputs[kind](model, device, dtype) ->
    # keyword arguments, drawn anew for each call
    inputs: Mapping[str, Callable] = field(default_factory=dict)
    # it sets the attention backend itself (the distributed-inference guide's order): the case's build leaves the
    # model's default, as a user's loaded model has it
    sets_backend: bool = False
    # it compiles the model itself (regional compilation): the compiled mode (harness.core.modes) whose proof its case
    # gives, read from every graph its call compiles; planned in eager mode only (a compiled mode would compile twice)
    compiles: str | None = None

    @property
    def help(self) -> str:
        """The calls as a user writes them, in order."""
        return ", then ".join(call.text for call in self.calls)

    @property
    def changes_numbers(self) -> bool:
        """Its calls leave one device's output elsewhere than the plain model's (a LoRA stays loaded)."""
        return any(call.effect == CHANGES for call in self.calls) and not self.restores

    @property
    def restores(self) -> bool:
        """Its calls give the plain model back (a LoRA loaded, then unloaded)."""
        return self.equals is not None and self.equals.code is None and not self.equals.per_context

    def exists_on(self, layout) -> bool:
        return layout.world_size == 1 or on_layouts(self.layouts, layout)

    def stepwise(self, module, setting: Setting):
        """Its code as a generator of one step per call (harness.flows.calls): nothing runs before a step is asked."""
        if inspect.isgeneratorfunction(self.code):
            return self.code(module, setting)
        return _one_call(self.code, module, setting)


def _one_call(code: Callable, module, setting: Setting):
    code(module, setting)
    yield


@dataclass(frozen=True)
class FlowValue:
    """One value of the flow axis: a flow at a position (None for the default, no flow)."""

    name: str
    flow: Flow | None = None
    position: str = BEFORE

    @property
    def before(self) -> bool:
        return self.flow is not None and self.position == BEFORE


REGISTERED: Registry[Flow] = Registry("flow", "HARNESS_FLOWS")
VALUES: Registry[FlowValue] = Registry("flow", "HARNESS_FLOWS")  # the axis's values, both positions of every flow
VALUES.add(NONE, FlowValue(NONE), __name__)


def flow(*calls: Call, **declared):
    """Register the decorated function as the flow of its own name, making `calls` in order (both positions unless
    `positions` says). A flow of several calls is a generator that yields after each, so that one device's output
    can be taken between them and a control can leave the last one out; a flow of one call may simply return."""
    def register(code: Callable) -> Callable:
        name = code.__name__
        if name == NONE or name.endswith(SUFFIX):
            raise ValueError(f"flow {name!r} is named like an axis value ({code.__module__})")
        if not calls or (len(calls) > 1 and not inspect.isgeneratorfunction(code)):
            raise ValueError(f"flow {name!r} declares {len(calls)} calls: it needs one at least, and a generator that "
                             f"yields after each for several ({code.__module__})")
        found = REGISTERED.add(name, Flow(name, calls, code, **declared), code.__module__)
        for position in found.positions:
            value = name if position == BEFORE else name + SUFFIX
            VALUES.add(value, FlowValue(value, found, position), code.__module__)
        return code

    return register


def quick_values() -> list[str]:
    """The flow axis's values the quick plan runs: the default and each flow at the positions it declares `quick`."""
    return [name for name, value in VALUES.items() if value.flow is None or value.position in value.flow.quick]


def quick_compiled() -> list[str]:
    """The flow values the quick plan compiles (each flow's `quick_compiled`, before enable_parallelism)."""
    return [name for name, value in VALUES.items() if value.before and value.flow.quick_compiled]


def sets_backend(name: str) -> bool:
    """Whether the flow value `name` sets the attention backend itself: the case's build leaves the default."""
    found = value_of(name).flow
    return found is not None and found.sets_backend


def compiled_by(name: str) -> str | None:
    """The compiled mode the flow value `name` compiles the model in by its own call (`Flow.compiles`), or None."""
    found = value_of(name).flow
    return None if found is None else found.compiles


def compiling_mode(case) -> str:
    """The mode a case compiles in: that of a flow that compiles the model by its own call, else the case's own."""
    return compiled_by(case.flow) or case.mode


def inputs_of(name: str, kind: str) -> Callable | None:
    """What the flow value `name` passes with each call of a case of `kind` (`Flow.inputs`), or None."""
    found = value_of(name).flow
    return None if found is None else found.inputs.get(kind)


def value_of(name: str) -> FlowValue:
    if name not in VALUES:
        raise HarnessError(VALUES.unknown(name, [*VALUES, "all"]))
    return VALUES[name]


def refusal_of(value: FlowValue, layout) -> Refused | None:
    """What diffusers is declared to refuse of this flow value on `layout` (its source not yet read)."""
    if value.flow is None:
        return None
    return next((item for item in value.flow.refused if item.position == value.position and item.on(layout)), None)

