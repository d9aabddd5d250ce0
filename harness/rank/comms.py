"""Communication proof, what a collective is: which ops perform one, what each puts in, and which modules attend to a
context that may be whole on every rank. The recording itself is harness.rank.recorder's.

The recorder's dispatch mode sees each collective that reaches PyTorch's dispatcher, whoever issues it: the functional
collectives diffusers calls (`all_to_all_single` around Ulysses attention, `all_gather_tensor` for the ring's K/V and
the plan's gathers, `permute_tensor` in the ring's backward), the all-reduce DTensor issues when a row-wise layer's
partial sums are redistributed, and plain `torch.distributed` calls (`dist.all_gather` of a mask or of sizes), on
gloo as on NCCL. `CommDebugMode` counts the same ops but keeps every op of the run and no sizes; the recorder keeps
counts and bytes only.
"""

from __future__ import annotations

import functools
import inspect

import torch

NAMESPACES = {"_c10d_functional", "c10d_functional", "c10d", "_dtensor"}
# op name -> the collective it performs: the functional ops, the in-place and `_out` variants Inductor's generated
# code calls (an all-reduce reinplaced to `all_reduce_`: a compiled tensor-parallel backward ran nothing else, and
# none of it was counted), and c10d's own in-place spelling
COLLECTIVES = {
    **dict.fromkeys(("all_to_all_single", "alltoall_", "alltoall_base_", "shard_dim_alltoall"), "all_to_all"),
    **dict.fromkeys(("all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced",
                     "allgather_", "_allgather_base_", "allgather_coalesced_", "allgather_into_tensor_coalesced_"),
                    "all_gather"),
    **dict.fromkeys(("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "allreduce_",
                     "allreduce_coalesced_"), "all_reduce"),
    **dict.fromkeys(("reduce_scatter_tensor", "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced",
                     "reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"), "reduce_scatter"),
    **dict.fromkeys(("broadcast", "broadcast_"), "broadcast"),
    "send": "send", "isend": "send", "recv_": "recv", "irecv": "recv", "recv_any_source_": "recv",
    "gather_": "gather", "scatter_": "scatter", "reduce_": "reduce",
}


@functools.cache
def collective_of(func) -> str | None:
    """The collective an op performs, or None for every other op (`wait_tensor` included). Cached: asked per op."""
    namespace, _, name = func._schema.name.partition("::")
    return COLLECTIVES.get(name) if namespace in NAMESPACES else None


def payload_bytes(func, args, kwargs) -> int:
    """What this rank puts into the collective: its argument named `input*` (the functional ops' `input`, c10d's
    `input_tensors`), else its first (c10d's in-place `tensors`)."""
    arguments = func._schema.arguments
    values = [args[i] if i < len(args) else kwargs.get(arg.name) for i, arg in enumerate(arguments)]
    chosen = next((v for arg, v in zip(arguments, values, strict=True) if arg.name.startswith("input")), values[0])
    return sum(t.numel() * t.element_size() for t in _tensors(chosen))


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


CONTEXT = "encoder_hidden_states"  # what a cross-attention attends to; its keys and values may be whole on each rank


@functools.cache
def context_position(cls: type) -> int | None:
    """Where `forward` of `cls` takes CONTEXT positionally (Wan calls `attn2(x, context, None, None)`), if at all."""
    names = list(inspect.signature(cls.forward).parameters)[1:]
    return names.index(CONTEXT) if CONTEXT in names else None
