"""Faults in what users call around `enable_parallelism` (harness.flows): calls that every rank but rank 0 leaves
out (all of them, or the last: a user's `if rank == 0:` around them; the selftest runs one of each for every flow,
harness.run.flow_controls), a LoRA scale that reaches one rank only, a fused projection built wrong on one rank, and
an adapter that comes out different on the other ranks. Each acts on the calls the flow makes, never on the
one-device run (rank 0's own)."""

from __future__ import annotations

import contextlib

from harness.faults.patching import patched
from harness.faults.registry import fault


def _not_rank_zero() -> bool:
    import torch.distributed as dist

    return dist.is_initialized() and dist.get_rank() != 0


def _calls_left_out(left_out):
    """Every rank but rank 0 makes the flow's calls less `left_out(n)` of its `n` last ones."""
    from harness.flows import calls

    return patched(calls, "to_make",
                   lambda flow: len(flow.calls) - (left_out(len(flow.calls)) if _not_rank_zero() else 0))


@fault("flows: every rank but rank 0 makes none of the flow's calls (a user's `if rank == 0:` around them)")
def flow_calls_rank0_only():
    return _calls_left_out(lambda count: count)


@fault("flows: every rank but rank 0 leaves out the flow's last call (a user's `if rank == 0:` around it)")
def flow_last_call_rank0_only():
    return _calls_left_out(lambda count: 1)


@fault("flows: the adapter weights given to set_adapters reach rank 0 only; every other rank keeps the adapter at its "
       "full scale")
def lora_scale_one_rank():
    from diffusers.loaders.peft import PeftAdapterMixin

    original = PeftAdapterMixin.set_adapters

    def first_rank_only(self, adapter_names, weights=None):
        return original(self, adapter_names, None if _not_rank_zero() else weights)

    return patched(PeftAdapterMixin, "set_adapters", first_rank_only)


@fault("flows: on every rank but rank 0, fuse_qkv_projections builds the fused projection with the key's weights in "
       "the value's place")
def fused_qkv_one_rank():
    from diffusers.models.attention import AttentionModuleMixin

    original = AttentionModuleMixin.fuse_projections

    def fuse_wrong_on_other_ranks(self):
        original(self)
        fused = getattr(self, "to_qkv", None)
        if fused is not None and _not_rank_zero():
            third = fused.weight.shape[0] // 3
            fused.weight.data[2 * third:] = fused.weight.data[third:2 * third].clone()

    return patched(AttentionModuleMixin, "fuse_projections", fuse_wrong_on_other_ranks)


def _doubled_on_other_ranks(original):
    """`original` (an adapter's add or load), then every rank but rank 0 doubles the adapter's lora_B weights."""
    def call(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if _not_rank_zero():
            import torch

            with torch.no_grad():
                for name, parameter in self.named_parameters():
                    if ".lora_B." in name:
                        parameter.mul_(2.0)
        return result

    return call


@fault("flows: on every rank but rank 0, the adapter added (PEFT's add_adapter) or loaded (load_lora_adapter) comes "
       "out with its lora_B weights doubled")
@contextlib.contextmanager
def adapter_other_ranks():
    from diffusers.loaders.peft import PeftAdapterMixin

    with patched(PeftAdapterMixin, "add_adapter", _doubled_on_other_ranks(PeftAdapterMixin.add_adapter)), \
            patched(PeftAdapterMixin, "load_lora_adapter", _doubled_on_other_ranks(PeftAdapterMixin.load_lora_adapter)):
        yield
