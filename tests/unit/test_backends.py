"""Backend availability (a real probe), dispatch and kernel proof checks."""


import pytest
import torch

from harness.rank import backends
from harness.rank.kernels import FLASH_CPU, MATH, dispatch_mismatch, kernel_mismatch


def test_dispatch_must_be_the_requested_backend_only():
    assert dispatch_mismatch("native", {"native": 8}) is None
    assert dispatch_mismatch("_native_math", {"native": 8}) == "requested _native_math, dispatched native:8"
    assert dispatch_mismatch("native", {}) == "requested native, dispatched nothing"
    assert "flex:1" in dispatch_mismatch("native", {"native": 7, "flex": 1})


def test_kernels_must_fit_the_backend():
    assert kernel_mismatch("_native_math", {MATH: 2}) is None
    assert "flash_attention_for_cpu" in kernel_mismatch("_native_math", {FLASH_CPU: 2})
    assert kernel_mismatch("native", {FLASH_CPU: 2}) is None  # SDPA chooses among its kernels
    assert kernel_mismatch("_native_flash", {}) == "requested _native_flash, but no attention kernel executed"
    assert kernel_mismatch("sage", {}) is None  # not judged: package kernels vary by version


def test_backend_table_covers_every_diffusers_backend():
    from diffusers.models.attention_dispatch import AttentionBackendName

    rows = {row["backend"]: row for row in backends.backend_table()}
    assert set(rows) == {member.value for member in AttentionBackendName}
    assert rows["native"]["context_parallel"] and not rows["_native_math"]["context_parallel"]
    assert rows["native"]["bf16"] == "usable"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectations")
def test_probe_reasons_on_cpu():
    assert backends.unavailable_reason("_native_cudnn", "bf16").startswith("needs CUDA")
    assert "xformers" in backends.unavailable_reason("xformers", "bf16")
    assert backends.unavailable_reason("_native_flash", "fp32") is None


def test_probe_runs_once_per_backend_and_dtype():
    """A plan asks once per case; the probe (a real dispatch) must run once per (backend, dtype), then be cached."""
    backends.probe.cache_clear()
    for _ in range(3):
        for name in ("native", "_native_math", "_native_flash"):
            backends.unavailable_reason(name, "bf16")
    info = backends.probe.cache_info()
    assert (info.misses, info.hits) == (3, 6)


def test_probe_calls_do_not_count_as_dispatches():
    backends.install_dispatch_counters()
    backends.reset_dispatches()
    backends.probe.cache_clear()
    backends.unavailable_reason("native", "fp32")
    assert backends.dispatches() == {}


def test_a_registry_where_two_names_share_one_function_is_flagged(monkeypatch):
    backends.install_dispatch_counters()
    assert backends.registry_problems() == []  # diffusers 0.42.1: every name has a function of its own
    shared = {**backends.DEFINED, "_native_flash": backends.DEFINED["native"]}
    monkeypatch.setattr(backends, "DEFINED", shared)
    assert backends.registry_problems() == [
        f"backends _native_flash, native share one function {backends.DEFINED['native']}"]
