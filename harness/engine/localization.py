"""Where a case breaks (harness.rank.localize): every module's output under the layout against the same module on
one device, from the reference's weights, without the case's fault, in fp32 and, for low precision, in the case's
dtype (its own noise is not a divergence); for a train case its backward too."""

from __future__ import annotations

from dataclasses import replace

from harness.core.layouts import Layout
from harness.core.loads import ENABLE, load_of
from harness.core.records import Case, Localization
from harness.engine.context import RankContext
from harness.kinds import kind_of
from harness.rank import backends, faults, localize, training


def localize_case(context: RankContext, case: Case, rank: int, world_size: int) -> Localization | None:
    """Every rank traces the case under its layout; rank 0 traces it on one device and returns what it found (None
    on the other ranks)."""
    reference, kind = context.reference(case), kind_of(case.kind)
    with faults.active(case.fault if load_of(case.load).checkpoint else None):  # as the case ran (casework)
        built = context.build(case, reference)
    with faults.active(case.fault):
        context.apply_layout(case, built)
        packed = training.packed_parameters(built.module, case.layout.tp) if case.layout.tp > 1 else {}
        with context.torch_context_parallel(case, built):  # PyTorch's CP wraps the run: its trace too
            records, grads, untraced = _trace(built, 1.0 / case.layout.dp)
    backends.reset_active_backend()
    gathered = localize.gather_records(records, world_size)
    gathered_grads = localize.gather_records(grads, world_size) if grads is not None else None
    if rank != 0:
        return None
    single, single_grads, _ = _single_trace(context, case, "fp32", reference)
    own, own_grads, _ = _single_trace(context, case, case.dtype, reference) if case.dtype != "fp32" \
        else (None, None, None)
    outputs, inputs = ({name[:-len(".weight")]: (blocks, degree) for name, (dim, blocks, degree) in packed.items()
                        if name.endswith(".weight") and dim == side} for side in (0, 1))
    split = case.layout.is_context_parallel or case.layout.is_torch_context_parallel
    lengths = kind.split_lengths(case) if split else None
    streams = tuple((lengths or {}).values())
    forward = localize.localize(gathered, single, own, outputs, streams, data_parallel=case.layout.dp)
    backward = None
    if gathered_grads is not None:  # backward order: the first module whose backward hands on a wrong gradient
        backward = localize.localize(gathered_grads, single_grads, own_grads, inputs, streams, gradients=True,
                                     data_parallel=case.layout.dp, called={name for name, _, _ in single})
    return Localization(forward, backward, localize.summary(forward, backward), untraced)


def _trace(built, scale: float) -> tuple[list, list | None, str | None]:
    """The forward records, the backward's (train), and why the backward could not be traced (every rank fails
    alike: full backward hooks around some tensor-parallel models' DTensors)."""
    if built.loss is not None:
        try:
            return (*localize.trace_backward(built.module, built.loss, scale), None)
        except Exception as error:  # noqa: BLE001 - said in the localization, the forward still traced
            untraced = f"backward not traced: {backends.first_line(error)}"
            return localize.trace(built.module, built.forward or built.run), None, untraced
    return localize.trace(built.module, built.forward or built.run), None, None


def _single_trace(context: RankContext, case: Case, dtype: str, reference) -> tuple[list, list | None, str | None]:
    backend = case.backend if case.layout.world_size > 1 else "native"
    single = replace(case, layout=Layout("single"), backend=backend, dtype=dtype, fault=None, load=ENABLE)
    built = kind_of(case.kind).build(single, reference, context.device)
    try:
        return _trace(built, 1.0)
    finally:
        backends.reset_active_backend()
