"""Kernel-level proof: which attention kernels PyTorch actually executed, and whether they fit the backend.

The dispatch counters say which diffusers backend function ran; the recording of the case's run
(harness.rank.recorder) says which aten kernel ran below it (users have found a flash kernel running while the math
backend was selected).
"""

from __future__ import annotations

import functools

MATH = "aten::_scaled_dot_product_attention_math"
FLASH = "aten::_scaled_dot_product_flash_attention"
FLASH_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
EFFICIENT = "aten::_scaled_dot_product_efficient_attention"
CUDNN = "aten::_scaled_dot_product_cudnn_attention"
FLEX = "flex_attention"  # a higher-order op
SDPA_KERNELS = {MATH, FLASH, FLASH_CPU, EFFICIENT, CUDNN, "aten::_scaled_dot_product_fused_attention_overrideable"}

# What each backend may run. `native` is PyTorch's own choice among the SDPA kernels; backends not listed
# (flash-attn, sage, xformers, hub kernels) are recorded but not judged: their kernel names vary by package version.
EXPECTED = {
    "native": SDPA_KERNELS,
    "_native_math": {MATH},
    "_native_flash": {FLASH, FLASH_CPU},
    "_native_efficient": {EFFICIENT},
    "_native_cudnn": {CUDNN},
    "flex": {FLEX},
}
_RECORDED_FRAGMENTS = ("flash_attn", "sageattn", "xformers", "memory_efficient_attention")


def is_attention_kernel(name: str) -> bool:
    """Forward kernels only: a backward kernel proves nothing the forward's did not."""
    if "backward" in name:
        return False
    return name in SDPA_KERNELS or name == FLEX or any(fragment in name for fragment in _RECORDED_FRAGMENTS)


@functools.cache
def kernel_of_operator(name: str) -> str | None:
    """The attention kernel an operator is (its schema name, or a higher-order op's name), or None for every other
    op. Cached: asked for every op of a recorded run (harness.rank.recorder)."""
    return name if is_attention_kernel(name) else None


def kernel_mismatch(backend: str, kernels: dict[str, int]) -> str | None:
    """Why the executed kernels do not prove `backend` ran; None when they do (or the backend is not judged)."""
    expected = EXPECTED.get(backend)
    if expected is None:
        return None
    if not kernels:
        return f"requested {backend}, but no attention kernel executed"
    foreign = sorted(name for name in kernels if name not in expected)
    if foreign:
        return f"requested {backend}, but kernel(s) {', '.join(foreign)} executed"
    return None


def function_mismatch(backend: str, expected: str | None, functions: dict[str, int]) -> str | None:
    """The registry name can be right while its entry holds another backend's function, which on this device may run
    the very same kernel (`native` and `_native_flash` on CPU): only the function's identity tells them apart, and
    only against what the backend must hold (harness.catalogue.backends), never against the registry itself."""
    ran = ", ".join(f"{name}:{count}" for name, count in sorted(functions.items()))
    if expected is None:
        if not functions:
            return None
        return (f"requested {backend}, which the harness's catalogue of backend functions does not know ({ran} ran): "
                "update harness/catalogue/backends.py")
    if not functions or set(functions) == {expected}:
        return None
    return f"requested {backend} (the catalogue says {expected}), but {ran} ran"


def dispatch_mismatch(backend: str, dispatched: dict[str, int]) -> str | None:
    """A silent fallback must never pass as parity: only the requested backend may have been dispatched."""
    if set(dispatched) == {backend}:
        return None
    ran = ", ".join(f"{name}:{count}" for name, count in sorted(dispatched.items())) or "nothing"
    return f"requested {backend}, dispatched {ran}"
