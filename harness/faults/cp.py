"""Context-parallel faults: attention that never sees the other ranks' chunks, a module left out of the plan, a ring
that never exchanges, a backward on the local chunk, and changes around diffusers' final gather."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.faults.patching import patched
from harness.faults.registry import fault

if TYPE_CHECKING:
    import torch


@fault("context parallel: each rank attends only to its own chunk (the classic two half-images bug)")
def cp_local_attention():
    import torch
    from diffusers.models import attention_dispatch as dispatch

    def local_only(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, *, forward_op, backward_op, _parallel_config=None):
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        return out.permute(0, 2, 1, 3)

    return patched(dispatch, "_templated_context_parallel_attention", local_only)


@fault("context parallel: one attention module is left out of the parallel plan (its processor never gets the CP "
       "config), so it attends to its own chunk and never communicates")
def cp_attention_left_out():
    # `enable_parallelism` hands every attention processor the CP config; here the first attention module keeps a
    # processor without it, as a module the plan forgot would: its attention runs locally on the rank's chunk.
    import copy

    from diffusers import ModelMixin

    from harness.catalogue.attention import attention_classes

    original = ModelMixin.enable_parallelism

    def enable_parallelism(self, *args, **kwargs):
        original(self, *args, **kwargs)
        module = next(m for m in self.modules() if isinstance(m, attention_classes()))
        module.processor = copy.copy(module.processor)
        module.processor._parallel_config = None

    return patched(ModelMixin, "enable_parallelism", enable_parallelism)


class _NoKVExchange:
    """diffusers' `funcol` as the attention dispatcher sees it, except that an all-gather (the ring's K/V exchange)
    returns the rank's own buffer once per ring rank."""

    def __init__(self, funcol):
        self._funcol = funcol

    def __getattr__(self, name):
        return getattr(self._funcol, name)

    @staticmethod
    def all_gather_tensor(tensor, gather_dim, group):
        import torch
        import torch.distributed as dist

        return torch.cat([tensor] * dist.get_world_size(group), dim=gather_dim)


@fault("context parallel: the ring never exchanges K/V; every step reuses the rank's own")
def ring_skips_exchange():
    from diffusers.models import attention_dispatch as dispatch

    return patched(dispatch, "funcol", _NoKVExchange(dispatch.funcol))


@fault("context parallel: attention's forward is right, its backward uses only the rank's own key/value chunk "
       "(gradients wrong, every forward check passes)")
def cp_backward_local_only():
    import torch
    from diffusers.models import attention_dispatch as dispatch

    original = dispatch._templated_context_parallel_attention

    def local_backward(query, key, value, *args, **kwargs):
        right = original(query, key, value, *args, **kwargs)
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        local = torch.nn.functional.scaled_dot_product_attention(q, k, v).permute(0, 2, 1, 3)
        return local + (right - local).detach()  # the forward's numbers, the local attention's gradient

    return patched(dispatch, "_templated_context_parallel_attention", local_backward)


def _around_gather(before=None, after=None):
    """diffusers' context-parallel gather (`EquipartitionSharder.unshard`) with a change to each rank's shard before
    it, or to the gathered output after it: where a layout's own bugs live."""
    from diffusers.hooks.context_parallel import EquipartitionSharder

    original = EquipartitionSharder.__dict__["unshard"]

    def unshard(cls, tensor, dim, mesh):
        gathered = original.__func__(cls, before(tensor) if before else tensor, dim, mesh)
        return after(gathered) if after else gathered

    return patched(EquipartitionSharder, "unshard", classmethod(unshard))


@fault("low precision: each rank rounds its output shard to 4 mantissa bits before the gather")
def extra_rounding():
    # Each rank rounds its output shard once more (to 4 mantissa bits) before the gather: a quiet precision loss
    # of the size a sloppy cast in a layout causes, below the fixed bf16 tolerance but above the error budget.
    def rounded(tensor):
        return _round_mantissa(tensor.float(), bits=4).to(tensor.dtype) if tensor.is_floating_point() else tensor

    return _around_gather(before=rounded)


@fault("low precision's control: rank 1's part of the output comes back 2% larger through the final gather (a merge "
       "that weighs one rank's part wrong): in bf16 below the dtype's own error against fp32, far above the noise "
       "between a layout and one device")
def rank1_part_2pct():
    import torch.distributed as dist

    return _around_gather(before=lambda shard: shard * 1.02 if dist.get_rank() == 1 and shard.is_floating_point()
                          else shard)


@fault("context parallel: rank 1's final gather returns a slightly different output than rank 0's")
def rank1_diverges():
    # Rank 0's output is right; rank 1 ends with one value off by 1e-2 after the last gather. Comparing rank 0's
    # output alone cannot see it.
    import torch.distributed as dist

    return _around_gather(after=lambda out: _nudged(out, 1e-2) if dist.get_rank() == 1 else out)


@fault("low precision: in bf16 only, one output value comes back 0.02 off after the final gather")
def bf16_few_tokens():
    # A wrong value in bf16 only: the mean error hardly moves (the mean budget passes), the fixed 0.15 tolerance
    # passes; only the max against the single-device bf16 max can see it.
    import torch

    return _around_gather(after=lambda out: _nudged(out, 0.02) if out.dtype == torch.bfloat16 else out)


def _nudged(tensor: torch.Tensor, by: float) -> torch.Tensor:
    """A copy with its first value moved by `by` (integer tensors are left alone)."""
    if not tensor.is_floating_point():
        return tensor
    tensor = tensor.clone()
    tensor.view(-1)[0] += by
    return tensor


def _round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round to `bits` mantissa bits (bf16 keeps 7 of its own, so this is an extra rounding step)."""
    import torch

    mantissa, exponent = torch.frexp(x)
    scale = 2.0 ** (bits + 1)
    return torch.ldexp(torch.round(mantissa * scale) / scale, exponent)


@fault("context parallel: a `_cp_plan` input named after no argument of forward is silently ignored, not refused "
       "(the input the plan meant to split stays whole, and nothing says so)")
def cp_plan_input_typo_ignored():
    from diffusers.hooks.context_parallel import ModuleForwardMetadata

    original = ModuleForwardMetadata._get_parameter_from_args_kwargs

    def lenient(self, identifier, args=(), kwargs=None):
        try:
            return original(self, identifier, args, kwargs)
        except ValueError as error:
            if "not found in" not in str(error):
                raise
            return None, True, None  # as if the argument were passed as None: diffusers then skips it

    return patched(ModuleForwardMetadata, "_get_parameter_from_args_kwargs", lenient)
