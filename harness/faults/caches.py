"""Faults in diffusers' caches (harness.flows.caches): a cache that never reuses, whose case would compare nothing the
cache does."""

from __future__ import annotations

from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("caches: First Block Cache decides to compute the remaining blocks at every step, on every rank (it never "
       "reuses them)")
def cache_never_reuses():
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    return patched(FBCHeadBlockHook, "_should_compute_remaining_blocks", lambda self, residual: True)
