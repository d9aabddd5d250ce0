"""Plan-time decisions: unknown names are rejected, what cannot run is SKIP with the reason."""

import pytest

from harness.errors import HarnessError
from harness.plan import build_plan


def _reasons(plan):
    return {p.case.case_id: p.skip_reason for p in plan}


def test_cp_incapable_backend_is_skipped_with_diffusers_reason():
    reasons = _reasons(build_plan(["flux"], ["ulysses2", "tp2"], ["_native_math", "native"], ["fp32"]))
    assert "not register backend '_native_math' as context-parallel" in reasons["flux/ulysses2/_native_math/fp32/tensor"]
    assert reasons["flux/ulysses2/native/fp32/tensor"] is None
    assert reasons["flux/tp2/_native_math/fp32/tensor"] is None


def test_cuda_only_backend_is_skipped_on_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    reasons = _reasons(build_plan(["flux"], ["tp2"], ["_native_cudnn", "flash"], ["bf16"]))
    assert reasons["flux/tp2/_native_cudnn/bf16/tensor"].startswith("needs CUDA")
    assert "flash-attn" in reasons["flux/tp2/flash/bf16/tensor"]


def test_too_many_ranks_is_skipped():
    reasons = _reasons(build_plan(["flux"], ["ulysses4"], ["native"], ["fp32"], cpu_max_ranks=2))
    assert "needs 4 ranks" in reasons["flux/ulysses4/native/fp32/tensor"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"models": ["fluxx"]}, "unknown model 'fluxx'; valid models: flux"),
        ({"layouts": ["ulyses2"]}, "unknown layout 'ulyses2'"),
        ({"backends": ["natve"]}, "unknown backend 'natve'"),
        ({"dtypes": ["fp8"]}, "unknown dtype 'fp8'; valid dtypes: fp32, bf16, fp16"),
    ],
)
def test_unknown_names_are_rejected_with_the_valid_ones(kwargs, message):
    arguments = {"models": ["flux"], "layouts": ["tp2"], "backends": ["native"], "dtypes": ["fp32"], **kwargs}
    with pytest.raises(HarnessError, match=message.replace("(", r"\(")):
        build_plan(**arguments)


def test_case_ids_read_like_the_contract():
    plan = build_plan(["flux"], ["ulysses2"], ["native"], ["fp32"])
    assert [p.case.case_id for p in plan] == ["flux/ulysses2/native/fp32/tensor"]
