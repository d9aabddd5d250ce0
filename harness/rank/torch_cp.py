"""PyTorch's own context parallelism around a case's run (the `tcpN` layouts), beside diffusers' `enable_parallelism`.

`context_parallel` shards the model's sequence inputs in place as buffers (rank r keeps chunk r of each), patches
`F.scaled_dot_product_attention` into PyTorch's ring for the block, and puts the buffers back after it; the output,
still sharded, is gathered by `context_parallel_unshard`. Load balancing follows the layout (off unless `tcpNlb`):
torch's own default is on, which non-causal attention cannot use (what torchtitan turns off to train Flux with it).
"""

from __future__ import annotations

import contextlib

import torch

Buffers = dict[str, tuple[torch.Tensor, int]]  # input name -> (the very tensor the run passes, its sequence dim)


def buffers_of(inputs: dict, seq_dims: dict[str, int]) -> Buffers:
    """The run's own input tensors that `seq_dims` (a spec's `torch_cp_buffers`) names; a declared buffer the run
    does not pass is an error, never a buffer quietly left whole."""
    return {name: (inputs[name], dim) for name, dim in seq_dims.items()}


@contextlib.contextmanager
def sharded(layout, mesh, buffers: Buffers):
    """The block runs under `context_parallel` on the mesh's `cp` dimension with the layout's rotation and load
    balancing; PyTorch's options are put back after it."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    tensors = [tensor for tensor, _ in buffers.values()]
    previous = _cp_options.enable_load_balance, _cp_options.rotate_method
    _cp_options.enable_load_balance = layout.load_balance
    set_rotate_method(layout.rotate)
    try:
        with context_parallel(mesh["cp"], buffers=tensors, buffer_seq_dims=[dim for _, dim in buffers.values()],
                              no_restore_buffers=set()):  # restored: a case may run its inputs again (localization)
            yield
    finally:
        _cp_options.enable_load_balance, _cp_options.rotate_method = previous


def unshard(layout, mesh, output: torch.Tensor, dim: int) -> torch.Tensor:
    """The whole output from each rank's chunk (the load balancer's order undone where it was on)."""
    from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard

    previous = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = layout.load_balance
    try:
        return context_parallel_unshard(mesh["cp"], [output], [dim])[0]
    finally:
        _cp_options.enable_load_balance = previous
