"""Faults that stand for a change in diffusers itself rather than a parallel bug: the single-device baseline runs with
them too, so the layouts still agree with each other while all of them disagree with the stored reference."""

from __future__ import annotations

from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("a change to diffusers itself: Flux's RoPE rotates the other way (applies to every run, baseline too)",
       model_change=True)
def rope_sign():
    from diffusers.models.transformers import transformer_flux

    original = transformer_flux.apply_rotary_emb

    def flipped(x, freqs_cis, *args, **kwargs):
        cos, sin = freqs_cis
        return original(x, (cos, -sin), *args, **kwargs)

    return patched(transformer_flux, "apply_rotary_emb", flipped)
