"""PyTorch's own context parallelism (the tcp layouts, harness.rank.torch_cp): the plan, the prediction, torch's
refusal and the CPU shim. Its negative controls with real processes (its ring on the rank's own K/V chunk, forward
and training; position ids out of step with their tokens; data-parallel ranks given the same samples, FSDP2 and FSDP2
x PyTorch's CP) are the selftest's, next to their clean twins (tests/unit/test_negative_controls.py)."""

import pytest
import torch

from harness.core.layouts import parse_layout
from harness.core.records import Case


def _case(model="flux", layout="tcp2", backend="native", kind="tensor", shape="default") -> Case:
    return Case(model, parse_layout(layout), backend, "fp32", kind=kind, shape=shape)


def test_the_plan_runs_what_pytorchs_ring_can_serve_and_says_why_not_elsewhere():
    from harness.run.plan import skip_reason

    assert skip_reason(_case(), 4) is None
    assert skip_reason(_case(kind="train", layout="dp2xtcp2"), 4) is None
    assert "only native calls" in skip_reason(_case(backend="_native_flash"), 4)
    assert "QwenEmbedRope" in skip_reason(_case(model="qwenimage"), 4)
    assert "text tokens 7 not divisible by the degree 2" in skip_reason(_case(shape="txt7"), 4)
    assert "image kind" in skip_reason(_case(kind="image"), 4)


def test_data_parallel_torch_cp_is_planned_for_training_only():
    from harness.run.plan import build_plan

    plan = build_plan(["flux"], ["tcp2", "dp2xtcp2"], ["native"], ["fp32"], kinds=("tensor", "train"),
                      cpu_max_ranks=4)
    assert sorted(p.case.case_id for p in plan) == ["flux/dp2xtcp2/native/fp32/train", "flux/tcp2/native/fp32/tensor",
                                                    "flux/tcp2/native/fp32/train"]


class _Calls:
    def __init__(self, calls):
        self.calls, self.context_calls = calls, {}


@pytest.mark.parametrize(("layout", "collective", "per_call"),
                         [("tcp2", "all_gather", 1), ("tcp4alltoall", "all_to_all", 3)])
def test_the_proof_predicts_the_rings_kv_exchange_per_attention_call(layout, collective, per_call):
    from harness.catalogue.zoo import get_spec
    from harness.rank.comms_check import predict

    model = get_spec("flux").build()
    calls = {"transformer_blocks.0.attn": 1, "single_transformer_blocks.0.attn": 2, "proj_out": 1}
    expected = predict(model, parse_layout(layout), None, _Calls(calls))
    assert {(e.module, e.collective, e.at_least) for e in expected} == {
        ("transformer_blocks.0.attn", collective, per_call), ("single_transformer_blocks.0.attn", collective,
                                                              2 * per_call)}


def test_torch_refuses_load_balancing_for_non_causal_attention_in_the_words_the_known_issue_quotes():
    """The text known_issues.toml excuses for the tcp*lb layouts, pinned to torch's own ring."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    query = torch.randn(1, 2, 4, 8)
    previous = ring._cp_options.enable_load_balance
    ring._cp_options.enable_load_balance = True
    try:
        with pytest.raises(RuntimeError, match="Load balancing requires `is_causal=True`."):
            ring._templated_ring_attention(None, 2, None, query, query, query, is_causal=False)
    finally:
        ring._cp_options.enable_load_balance = previous


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shim is CPU only")
def test_the_cpu_shim_registers_the_cpu_sdpa_op_with_pytorchs_ring():
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    from harness.rank import cpu

    cpu.apply()
    aten = torch.ops.aten
    assert {aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default} <= set(ring.custom_ops)
