"""Communication proof, the recording: every collective a run performs, counted and sized per module.

A dispatch mode sees each collective that reaches PyTorch's dispatcher, whoever issues it: the functional
collectives diffusers calls (`all_to_all_single` around Ulysses attention, `all_gather_tensor` for the ring's K/V and
the plan's gathers, `permute_tensor` in the ring's backward), the all-reduce DTensor issues when a row-wise layer's
partial sums are redistributed, and plain `torch.distributed` calls (`dist.all_gather` of a mask or of sizes), on
gloo as on NCCL. `CommDebugMode` counts the same ops but keeps every op of the run and no sizes; this keeps counts and
bytes only. A collective belongs to the innermost module whose forward is running (a hook that runs after the
module's own hooks closes it, so a row-wise layer's all-reduce is its own); one in a backward pass to `BACKWARD`.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

OUTSIDE, BACKWARD = "(outside the model)", "(backward)"
NAMESPACES = {"_c10d_functional", "c10d_functional", "c10d", "_dtensor"}
# op name (both the functional and the in-place c10d spelling) -> the collective it performs
COLLECTIVES = {
    **dict.fromkeys(("all_to_all_single", "alltoall_", "alltoall_base_", "shard_dim_alltoall"), "all_to_all"),
    **dict.fromkeys(("all_gather_into_tensor", "all_gather_into_tensor_coalesced", "allgather_", "_allgather_base_",
                     "allgather_coalesced_", "allgather_into_tensor_coalesced_"), "all_gather"),
    **dict.fromkeys(("all_reduce", "all_reduce_coalesced", "allreduce_", "allreduce_coalesced_"), "all_reduce"),
    **dict.fromkeys(("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "reduce_scatter_",
                     "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"), "reduce_scatter"),
    **dict.fromkeys(("broadcast", "broadcast_"), "broadcast"),
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
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


class _Mode(TorchDispatchMode):
    supports_higher_order_operators = True  # flex attention is a higher-order op: let it run, nothing to count

    def __init__(self, recorder: CommsRecorder):
        super().__init__()
        self.recorder = recorder

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Step aside while torch.compile traces (flex attention compiles its kernel wrapper, and Dynamo refuses to
        trace under a user dispatch mode); a collective inside a compiled graph is then not seen op by op."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(t is not torch.Tensor and _is_dtensor(t) for t in types):
            return NotImplemented  # DTensor desugars into plain ops (its collectives among them) that come back here
        collective = collective_of(func)
        if collective is not None:
            self.recorder.add(collective, payload_bytes(func, args, kwargs))
        return func(*args, **kwargs)


@functools.cache
def _is_dtensor(cls) -> bool:
    from torch.distributed.tensor import DTensor

    return issubclass(cls, DTensor)


CONTEXT = "encoder_hidden_states"  # what a cross-attention attends to; its keys and values may be whole on each rank


@functools.cache
def _context_position(cls: type) -> int | None:
    """Where `forward` of `cls` takes CONTEXT positionally (Wan calls `attn2(x, context, None, None)`), if at all."""
    names = list(inspect.signature(cls.forward).parameters)[1:]
    return names.index(CONTEXT) if CONTEXT in names else None


class CommsRecorder:
    """`with CommsRecorder(model) as comms: run()`; then `comms.table` (module -> collective -> [count, bytes]),
    `comms.calls` (module -> forward calls) and `comms.context_calls` (those given a CONTEXT tensor): what a
    prediction is scaled by."""

    def __init__(self, root: torch.nn.Module):
        self.root = root
        self.table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        self.calls: dict[str, int] = defaultdict(int)
        self.context_calls: dict[str, int] = defaultdict(int)
        self._stack: list[str] = []
        self._handles: list = []
        self._mode = _Mode(self)

    def add(self, collective: str, size: int) -> None:
        backward = torch._C._current_graph_task_id() != -1
        module = BACKWARD if backward else (self._stack[-1] if self._stack else OUTSIDE)
        entry = self.table[module][collective]
        entry[0] += 1
        entry[1] += size

    def __enter__(self) -> CommsRecorder:
        for name, module in self.root.named_modules():
            self._handles += [module.register_forward_pre_hook(self._enter(name, module), prepend=True,
                                                               with_kwargs=True),
                              module.register_forward_hook(self._leave, always_call=True)]
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter(self, name: str, module: torch.nn.Module):
        position = _context_position(type(module))

        def hook(_, args, kwargs):
            self.calls[name] += 1
            self._stack.append(name)
            if position is not None:
                context = kwargs.get(CONTEXT, args[position] if position < len(args) else None)
                self.context_calls[name] += isinstance(context, torch.Tensor)

        return hook

    def _leave(self, *_) -> None:
        if self._stack:
            self._stack.pop()

    def recorded(self) -> dict[str, dict[str, list[int]]]:
        """The table as plain sorted dicts (what a CaseRecord carries)."""
        return {module: dict(sorted(row.items())) for module, row in sorted(self.table.items())}
