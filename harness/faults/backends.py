"""Attention-backend faults: diffusers' registry serving a name with another backend's function, a kernel other than
the one dispatched, a subtly wrong softmax scale; and the registration mistake the plan must see before any case."""

from __future__ import annotations

import contextlib

from harness.faults.patching import patched
from harness.faults.registry import fault


def _registry_entry(name: str, replacement):
    """diffusers' registry with one backend function swapped: the dispatcher reads the registry's table on every
    call, so the table is replaced by a copy with that one entry changed (nested swaps copy the swapped table)."""
    from harness.rank.backends import registry

    holder = registry()
    key = next(key for key in holder._backends if getattr(key, "value", key) == name)
    return patched(holder, "_backends", {**holder._backends, key: replacement})


def registry_rewritten(name: str, holder: str):
    """A registration mistake as diffusers would make it at import: backend `name` holds `holder`'s function, for
    everything that reads the registry meanwhile (a plan included). Not a per-case fault: what it breaks is decided
    before any case runs."""
    return _registry_entry(name, _backend_fn(holder))


def _backend_fn(name: str):
    from harness.rank.backends import registry

    return next(fn for key, fn in registry()._backends.items() if getattr(key, "value", key) == name)


@fault("backends: `_native_math` and `native` are silently served by each other")
@contextlib.contextmanager
def redirect_dispatch():
    # diffusers silently serving `_native_math` (or `native`) with another backend: counted as that other one.
    native, math = _backend_fn("native"), _backend_fn("_native_math")
    with _registry_entry("_native_math", native), _registry_entry("native", math):
        yield


@fault("backends: the `_native_flash` entry holds `native`'s function, counted as `_native_flash` (both run the same "
       "flash kernel on CPU)")
def redirect_same_kernel():
    # The name counts right and the kernel is right (on CPU `native` also runs the flash kernel): only the identity
    # of the function that ran shows that `_native_flash` was not what ran.
    from harness.rank.backends import _counted

    native = _backend_fn("native")
    return _registry_entry("_native_flash", _counted("_native_flash", getattr(native, "__wrapped__", native)))


@fault("backends: `_native_math` is dispatched but the flash kernel executes")
def math_runs_flash():
    # The registry says `_native_math` ran (its counter ticks), but PyTorch executes the flash kernel beneath it.
    from diffusers.models import attention_dispatch as dispatch

    from harness.rank.backends import _counted

    return _registry_entry("_native_math", _counted("_native_math", dispatch._native_flash_attention))


@fault("backends: SDPA runs with a 5% larger softmax scale (subtly wrong numbers)")
def scaled_softmax():
    # Every native SDPA call uses a 5% larger softmax scale: the right backend and kernel, subtly wrong numbers.
    import torch

    original = torch.nn.functional.scaled_dot_product_attention

    def scaled(query, key, value, *args, scale=None, **kwargs):
        base = scale if scale is not None else query.shape[-1] ** -0.5
        return original(query, key, value, *args, scale=base * 1.05, **kwargs)

    return patched(torch.nn.functional, "scaled_dot_product_attention", scaled)
