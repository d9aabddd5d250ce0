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


def test_the_installed_registry_holds_what_the_catalogue_says():
    """diffusers 0.42.1: every name holds its own function, the one the catalogue names."""
    assert backends.registry_problems() == {}
    assert backends.expected_function("_native_flash") == "diffusers.models.attention_dispatch._native_flash_attention"


def test_a_registration_mistake_is_seen_against_the_catalogue_not_the_registry():
    """The mistake diffusers could make at import: `_native_flash` mapped to `native`'s function. Checked against the
    registry itself it would pass; against the catalogue both names are flagged, and an unknown name or function
    says to update the catalogue."""
    from harness.catalogue import backends as catalogue

    held = backends.registry_held()
    mixed = {**held, "_native_flash": held["native"]}
    problems = catalogue.registry_problems(mixed, "0.42.1")
    assert set(problems) == {"native", "_native_flash"}
    assert "maps backend '_native_flash' to diffusers.models.attention_dispatch._native_attention" in \
        problems["_native_flash"]
    assert problems["native"].startswith("backends _native_flash, native share one function")
    renamed = catalogue.registry_problems({**held, "_native_flash": "diffusers.x._new_flash"}, "0.42.1")
    assert list(renamed) == ["_native_flash"] and "update the catalogue" in renamed["_native_flash"]
    unknown = catalogue.registry_problems({**held, "flash_5": "diffusers.x._flash_5"}, "0.42.1")
    assert list(unknown) == ["flash_5"] and "not in the harness's catalogue" in unknown["flash_5"]


def test_the_catalogue_knows_each_release_spelling():
    from harness.catalogue import backends as catalogue

    assert catalogue.expected_function("aiter", "0.38.0").endswith("._aiter_flash_attention")
    assert catalogue.expected_function("aiter", "0.40.0") is None
    assert catalogue.expected_function("aiter_fa2_hub", "0.40.0").endswith("._aiter_flash_attention")
    assert catalogue.expected_function("sage_blackwell_hub", "0.40.0") is None


def test_a_registration_mistake_makes_every_case_of_both_names_an_error_at_plan_time():
    from harness.run.selftest import registry_control
    from harness.run.settings import load_settings

    ok, line = registry_control(load_settings())
    assert ok, line
    assert line.startswith("32 of 32 cells ERROR at plan time")
    from harness.run.plan import build_plan

    clean = build_plan(["flux"], ["single", "ulysses2"], ["_native_flash"], ["fp32"], kinds=("tensor",))
    assert [p.plan_error for p in clean] == [None, None]  # the control's own negative: a right registry runs


def test_the_function_that_ran_is_checked_against_the_catalogue():
    from harness.rank.kernels import function_mismatch

    must = "diffusers.models.attention_dispatch._native_flash_attention"
    assert function_mismatch("_native_flash", must, {must: 2}) is None
    assert "but diffusers.models.attention_dispatch._native_attention:2 ran" in \
        function_mismatch("_native_flash", must, {"diffusers.models.attention_dispatch._native_attention": 2})
    assert "update harness/catalogue/backends.py" in function_mismatch("flash_5", None, {"x.y": 1})


def test_a_compile_error_s_message_keeps_what_dynamo_explains_it_by():
    """Dynamo's "RuntimeError when making fake tensor call" names what the traced call raised only in its
    explanation: kept, so that the eager error's known issue still recognises its compiled twin."""
    class TorchRuntimeError(RuntimeError):
        pass

    error = TorchRuntimeError("RuntimeError when making fake tensor call\n  Explanation: The size of tensor a (8) "
                              "must match the size of tensor b (16)\n  Hint: none")
    assert backends.first_line(error) == ("TorchRuntimeError: RuntimeError when making fake tensor call (The size of "
                                          "tensor a (8) must match the size of tensor b (16))")
    assert backends.first_line(ValueError("one\ntwo")) == "ValueError: one"
