"""Deliberate bugs for negative controls: each must make the harness report FAIL.

A fault is active only inside `active(name)`, for one case, in one worker process.
"""

from __future__ import annotations

import contextlib

import torch

FAULTS = {
    "cp_local_attention": "context parallel: each rank attends only to its own chunk (the classic two half-images bug)",
    "tp_skip_allreduce": "tensor parallel: row-wise layers return their partial sums without the all-reduce",
}


def check(name: str) -> None:
    if name not in FAULTS:
        from harness.errors import HarnessError

        raise HarnessError(f"unknown fault {name!r}; valid faults: {', '.join(FAULTS)}")


@contextlib.contextmanager
def active(name: str | None):
    if name is None:
        yield
        return
    check(name)
    with globals()[f"_{name}"]():
        yield


@contextlib.contextmanager
def _cp_local_attention():
    from diffusers.models import attention_dispatch as dispatch

    original = dispatch._templated_context_parallel_attention

    def local_only(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, *, forward_op, backward_op, _parallel_config=None):
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        return out.permute(0, 2, 1, 3)

    dispatch._templated_context_parallel_attention = local_only
    try:
        yield
    finally:
        dispatch._templated_context_parallel_attention = original


@contextlib.contextmanager
def _tp_skip_allreduce():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import RowwiseParallel

    original = RowwiseParallel.__dict__["_prepare_output_fn"]  # the staticmethod object itself, to restore as-is

    def partial_sums(output_layouts, use_local_output, mod, outputs, device_mesh):
        local = outputs.to_local() if isinstance(outputs, DTensor) else outputs
        return local

    RowwiseParallel._prepare_output_fn = staticmethod(partial_sums)
    try:
        yield
    finally:
        RowwiseParallel._prepare_output_fn = original
