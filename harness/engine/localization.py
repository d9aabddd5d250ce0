"""Where a case breaks (harness.rank.localize): every module's output under the layout against the same module on
one device, from the reference's weights, without the case's fault (with it when the fault stands for a change to
diffusers itself), in fp32 and, for low precision, in the case's dtype (its own noise is not a divergence); for a
train case its backward too. A compiled case whose eager trace diverges nowhere is traced again under compile, each
repeated block compiled on its own, against the same eager single-device run: where compiling breaks it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness import faults
from harness.core.layouts import Layout
from harness.core.modes import EAGER, mode_of
from harness.core.records import Case, Localization, ModuleTrace
from harness.engine.context import RankContext
from harness.kinds import kind_of
from harness.loads import ENABLE, load_of
from harness.rank import backends, loading, localize, training
from harness.rank.compiled import compile_regions


def localize_case(context: RankContext, case: Case, rank: int, world_size: int) -> Localization | None:
    """Every rank traces the case under its layout (a compiled case: eager, then under compile); rank 0 traces it
    on one device and returns what it found (None on the other ranks)."""
    reference, kind = context.reference(case), kind_of(case.kind)
    eager = _layout_trace(context, case, reference, world_size)
    compiled = _layout_trace(context, case, reference, world_size, compiled=True) if case.mode != EAGER else None
    if rank != 0:
        return None
    with faults.active(case.fault if faults.is_model_change(case.fault) else None):  # a changed diffusers: both runs
        single, single_grads, _ = _single_trace(context, case, "fp32", reference)
        own, own_grads, _ = _single_trace(context, case, case.dtype, reference) if case.dtype != "fp32" \
            else (None, None, None)
    split = case.layout.is_context_parallel or case.layout.is_torch_context_parallel
    streams = tuple(((kind.split_lengths(case) if split else None) or {}).values())
    forward = localize.localize(eager.records, single, own, eager.outputs, streams, data_parallel=case.layout.dp)
    backward = None
    if eager.grads is not None:  # backward order: the first module whose backward hands on a wrong gradient
        backward = localize.localize(eager.grads, single_grads, own_grads, eager.inputs, streams, gradients=True,
                                     data_parallel=case.layout.dp, called={name for name, _, _ in single})
    line = localize.summary(forward, backward, eager.untraced)
    if compiled is not None and line.startswith("none"):  # eager is right everywhere: look where compiling broke it
        under = localize.localize(compiled.records, single, own, compiled.outputs, streams,
                                  data_parallel=case.layout.dp)
        line = _from_compiling(line, under, compiled.untraced)
    return Localization(forward, backward, line, eager.untraced)


@dataclass
class _Traced:
    """One trace of the case under its layout, gathered on rank 0 (None elsewhere): module outputs, gradients (a
    train case), what was not traced, and where diffusers' packed projections sit (outputs, inputs)."""

    records: list | None
    grads: list | None
    untraced: str | None
    outputs: dict
    inputs: dict


def _layout_trace(context: RankContext, case: Case, reference, world_size: int, compiled: bool = False) -> _Traced:
    """The case under its layout with its fault; `compiled`: each repeated block compiled as the case's mode
    compiles (regional, so every block's output is still seen), forward only."""
    with faults.active(case.fault if load_of(case.load).checkpoint else None):  # as the case ran (casework)
        built = context.build(case, reference)
    with faults.active(case.fault):
        context.apply_layout(case, built)
        packed = training.packed_parameters(built.module, case.layout.tp) if case.layout.tp > 1 else {}
        untraced = None
        if compiled:
            regions = compile_regions(case.mode, built.module)
            untraced = f"under {mode_of(case.mode).name}: {regions} compiled, the forward traced"
        with context.torch_context_parallel(case, built):  # PyTorch's CP wraps the run: its trace too
            if compiled:
                records, grads = localize.trace(built.module, built.forward or built.run, compiled=True), None
            else:
                records, grads, untraced = _trace(built, 1.0 / case.layout.dp)
    backends.reset_active_backend()
    outputs, inputs = ({name[:-len(".weight")]: (blocks, degree) for name, (dim, blocks, degree) in packed.items()
                        if name.endswith(".weight") and dim == side} for side in (0, 1))
    return _Traced(localize.gather_records(records, world_size),
                   localize.gather_records(grads, world_size) if grads is not None else None, untraced, outputs,
                   inputs)


def _from_compiling(eager_line: str, under: ModuleTrace, how: str | None) -> str:
    """A compiled case whose eager trace diverges nowhere: where its compiled trace does (the divergence comes from
    compiling), or that it does not either (still "none": whether that is a failure is the case's to say)."""
    if under.line is None:
        return f"{eager_line}; {how}: every module within its limit there too"
    return f"the divergence comes from compiling (eager: {eager_line.removeprefix('none: ')}); {how}: {under.line}"


def _trace(built, scale: float) -> tuple[list, list | None, str | None]:
    """The forward records, the backward's (train), and why the backward could not be traced (every rank fails
    alike: full backward hooks around some tensor-parallel models' DTensors)."""
    if built.loss is not None:
        try:
            records, grads, left_out = localize.trace_backward(built.module, built.loss, scale)
        except Exception as error:  # noqa: BLE001 - said in the localization, the forward still traced
            untraced = f"backward not traced: {backends.first_line(error)}"
            return localize.trace(built.module, built.forward or built.run), None, untraced
        said = f"backward of {', '.join(left_out)} not traced: a backward hook there breaks the backward itself" \
            if left_out else None
        return records, grads, said
    return localize.trace(built.module, built.forward or built.run), None, None


def _single_trace(context: RankContext, case: Case, dtype: str, reference) -> tuple[list, list | None, str | None]:
    backend = case.backend if case.layout.world_size > 1 else "native"
    single = replace(case, layout=Layout("single"), backend=backend, dtype=dtype, fault=None, load=ENABLE)
    built = kind_of(case.kind).build(single, reference, context.device, loading.enabled())
    context.flow_on_one_device(single, built)
    try:
        return _trace(built, 1.0)
    finally:
        backends.reset_active_backend()
