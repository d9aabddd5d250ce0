"""Faults in diffusers' caches (harness.flows.caches): a cache that never reuses, whose case would compare nothing the
cache does; and one whose ranks decide differently at a step, which the record of every rank's work per step names."""

from __future__ import annotations

from harness.faults.flows import _not_rank_zero
from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("caches: First Block Cache decides to compute the remaining blocks at every step, on every rank (it never "
       "reuses them)")
def cache_never_reuses():
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    return patched(FBCHeadBlockHook, "_should_compute_remaining_blocks", lambda self, residual: True)


@fault("caches: on every rank but rank 0, TaylorSeer takes the opposite decision after its warm-up (it reuses where "
       "rank 0 computes and computes where rank 0 reuses), as a decision kept on each rank's own would")
def cache_decides_alone():
    from diffusers.hooks.taylorseer_cache import TaylorSeerCacheHook

    original = TaylorSeerCacheHook._measure_should_compute

    def opposite_on_other_ranks(self):
        should_compute, state = original(self)
        if _not_rank_zero() and state.current_step >= self.disable_cache_before_step:
            should_compute = not should_compute
        return should_compute, state

    return patched(TaylorSeerCacheHook, "_measure_should_compute", opposite_on_other_ranks)
