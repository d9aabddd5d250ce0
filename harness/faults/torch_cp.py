"""Faults in PyTorch's own context parallelism (`context_parallel`, the tcp layouts, harness.rank.torch_cp): its
ring's K/V chunk, and the buffers it shards."""

from __future__ import annotations

import contextlib

from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("PyTorch's context parallelism: every step of its ring takes the rank's own K/V chunk from the gathered "
       "buffer (the exchange happens, each rank attends only to its own chunk)")
def tcp_own_kv_chunk():
    import torch.distributed as dist
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    original = ring._AllGatherRotater.next_buffer

    def own_chunk(self):
        original(self)  # waits for the all-gather, as the right step does
        return self._aggregated_buffer.chunk(dist.get_world_size(self._pg))[dist.get_rank(self._pg)]

    return patched(ring._AllGatherRotater, "next_buffer", own_chunk)


@fault("PyTorch's context parallelism: the image position ids go to `context_parallel` in reverse token order, so "
       "each rank rotates its tokens by other tokens' positions")
def tcp_positions_reversed():
    from harness.rank import torch_cp

    original = torch_cp.sharded

    @contextlib.contextmanager
    def reversed_ids(layout, mesh, buffers):
        flipped = [(tensor, dim) for name, (tensor, dim) in buffers.items() if name == "img_ids"]
        for tensor, dim in flipped:
            tensor.copy_(tensor.flip(dim))
        try:
            with original(layout, mesh, buffers):
                yield
        finally:
            for tensor, dim in flipped:  # the run's inputs as they were (context_parallel restores the flipped ones)
                tensor.copy_(tensor.flip(dim))

    return patched(torch_cp, "sharded", reversed_ids)
