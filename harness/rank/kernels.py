"""Kernel-level proof: which attention kernels PyTorch actually executed, and whether they fit the backend.

The dispatch counters say which diffusers backend function ran; the profiler says which aten kernel ran below it
(users have found a flash kernel running while the math backend was selected).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

MATH = "aten::_scaled_dot_product_attention_math"
FLASH = "aten::_scaled_dot_product_flash_attention"
FLASH_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
EFFICIENT = "aten::_scaled_dot_product_efficient_attention"
CUDNN = "aten::_scaled_dot_product_cudnn_attention"
FLEX = "FlexAttentionAutogradOp"
SDPA_KERNELS = {MATH, FLASH, FLASH_CPU, EFFICIENT, CUDNN, "aten::_scaled_dot_product_fused_attention_overrideable"}

# What each backend may run. `native` is PyTorch's own choice among the SDPA kernels; backends not listed
# (flash-attn, sage, xformers, hub kernels) are recorded but not judged: their kernel names vary by package version.
EXPECTED = {
    "native": SDPA_KERNELS,
    "_native_math": {MATH},
    "_native_flash": {FLASH, FLASH_CPU},
    "_native_efficient": {EFFICIENT},
    "_native_cudnn": {CUDNN},
    "flex": {FLEX, "flex_attention"},
}
_RECORDED_FRAGMENTS = ("flash_attn", "sageattn", "xformers", "memory_efficient_attention", "flex_attention")


def is_attention_kernel(name: str) -> bool:
    return name in SDPA_KERNELS or name == FLEX or any(fragment in name for fragment in _RECORDED_FRAGMENTS)


SCOPE = "harness::scope"


def profile_kernels(fn: Callable[[], object], scope=None) -> dict[str, int]:
    """Run `fn` once under torch.profiler and count the attention kernels it executed, only those inside `scope`'s
    forward when a module is given (a pipeline's VAE may call SDPA itself; only the transformer's are judged)."""
    from torch.profiler import ProfilerActivity, profile

    handles = _mark(scope) if scope is not None else []
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        for handle in handles:
            handle.remove()
    events = [e for e in prof.events() if is_attention_kernel(e.name) and (scope is None or _inside_scope(e))]
    return dict(sorted(Counter(event.name for event in events).items()))


def _mark(module) -> list:
    """Forward hooks that open and close a profiler range named SCOPE around every call of `module`."""
    import torch

    ranges = []

    def enter(*_):
        ranges.append(torch.autograd.profiler.record_function(SCOPE))
        ranges[-1].__enter__()

    def leave(*_):
        ranges.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]


def _inside_scope(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == SCOPE:
            return True
        parent = parent.cpu_parent
    return False


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
    the very same kernel (`native` and `_native_flash` on CPU): only the function's identity tells them apart."""
    if expected is None or not functions or set(functions) == {expected}:
        return None
    ran = ", ".join(f"{name}:{count}" for name, count in sorted(functions.items()))
    return f"requested {backend} (diffusers registers {expected}), but {ran} ran"


def dispatch_mismatch(backend: str, dispatched: dict[str, int]) -> str | None:
    """A silent fallback must never pass as parity: only the requested backend may have been dispatched."""
    if set(dispatched) == {backend}:
        return None
    ran = ", ".join(f"{name}:{count}" for name, count in sorted(dispatched.items())) or "nothing"
    return f"requested {backend}, dispatched {ran}"
