"""Localization on one process: putting each rank's module output back together, and naming the first module that
leaves the single-device run. Real layouts and the one-module bugs run in test_negative_controls."""

from __future__ import annotations

import torch

from harness.rank import localize


def _whole(candidates):
    return [whole for whole, _ in candidates]


def test_pieces_are_put_back_as_a_correct_layout_holds_them():
    full = torch.arange(24.0).reshape(1, 6, 4)
    same = localize.assemble([full, full.clone()], full.shape)
    assert torch.equal(_whole(same)[0], full) and same[0][1] == "replicated"
    sequence = localize.assemble([full[:, :3], full[:, 3:]], full.shape)  # context parallel: sequence shards
    assert torch.equal(_whole(sequence)[0], full)
    heads = localize.assemble([full[..., :2], full[..., 2:]], full.shape)  # tensor parallel: feature shards
    assert torch.equal(_whole(heads)[0], full)
    partial = localize.assemble([full, full * 0], full.shape)  # a row-wise layer without its all-reduce
    assert torch.equal(_whole(partial)[0], full) and "differ" in partial[0][1]
    assert localize.assemble([full[:, :2], full[:, :2]], full.shape)[0][0] is None  # 4 of 6 rows: cannot gather


def test_a_joint_sequence_of_separately_split_streams_has_a_candidate_per_order():
    text, image = torch.arange(4.0).reshape(1, 4, 1), 10 + torch.arange(8.0).reshape(1, 8, 1)
    joint = torch.cat([text, image], 1)
    pieces = [torch.cat([text[:, :2], image[:, :4]], 1), torch.cat([text[:, 2:], image[:, 4:]], 1)]
    candidates = localize.assemble(pieces, joint.shape, streams=(8, 4))
    assert not torch.equal(candidates[0][0], joint)  # plain concatenation interleaves the streams
    assert any(torch.equal(whole, joint) for whole in _whole(candidates))


def test_the_first_module_above_its_limit_is_named_with_the_one_before():
    good, bad = torch.ones(1, 4, 2), torch.ones(1, 4, 2) * 1.5
    single = [("a", good, None), ("b.inner", good, good), ("b", good, good), ("c", good, good)]
    ranks = [[("a", good, None), ("b.inner", good, good), ("b", bad, good), ("c", bad, bad)]] * 2
    found = localize.localize(ranks, single, None, {})
    assert found.first == 2 and found.line == "b: rel err 5.0e-01 > 1.0e-04 (previous 0.0e+00)"


def test_a_divergence_between_children_is_said_of_the_module_around_them():
    good, bad = torch.ones(1, 4, 2), torch.ones(1, 4, 2) * 2
    single = [("attn.to_q", good, good), ("attn.to_out.0", good, good), ("attn", good, good)]
    ranks = [[("attn.to_q", good, good), ("attn.to_out.0", bad, bad), ("attn", bad, good)]]
    assert localize.localize(ranks, single, None, {}).line.startswith("attn (first seen at its to_out.0):")


def test_low_precision_is_measured_against_its_own_dtype_on_one_device():
    expected, noisy = torch.ones(1, 4, 2), torch.ones(1, 4, 2) * 1.01
    single = [("a", expected, None)]
    own = [("a", noisy, None)]  # the dtype alone is 1% off here
    assert localize.localize([[("a", noisy, None)]], single, own, {}).first is None
    assert localize.localize([[("a", expected * 1.2, None)]], single, own, {}).first == 0
    assert localize.localize([[("a", noisy, None)]], single, None, {}).first == 0  # fp32 would call it broken


def test_data_parallel_samples_and_context_parallel_sequences_are_both_gathered():
    """dp2xulysses2: ranks 0-1 hold sample 0's sequence halves, ranks 2-3 sample 1's. Over all four ranks no single
    dimension adds up ("cannot gather"); by data-parallel group the module is compared, and a wrong one is named."""
    full = torch.arange(48.0).reshape(2, 6, 4)
    pieces = [full[:1, :3], full[:1, 3:], full[1:, :3], full[1:, 3:]]
    assert localize.assemble(pieces, full.shape)[0][0] is None
    single = [("a", full, None), ("b", full, None)]
    wrong = [piece * 1.1 for piece in pieces]
    ranks = [[("a", piece, None), ("b", bad, None)] for piece, bad in zip(pieces, wrong, strict=True)]
    found = localize.localize(ranks, single, None, {}, data_parallel=2)
    assert found.modules[0]["error"] == 0.0 and "data-parallel groups" in found.modules[0]["how"]
    assert found.line.startswith("b: rel err") and found.uncompared == []
    assert localize.localize(ranks, single, None, {}).uncompared == ["a", "b"]  # without the groups: nothing


def test_modules_that_could_not_be_compared_are_never_none():
    full = torch.ones(1, 6, 4)
    single = [("a", full, None), ("b", full, None)]
    odd = [[("a", full[:, :2], None), ("b", full[:, :3], None)], [("a", full[:, :2], None), ("b", full[:, 3:], None)]]
    found = localize.localize(odd, single, None, {})
    assert localize.summary(found) == "none within the 1 compared module outputs; 1 not compared (a)"
    nothing = localize.localize([[("a", full[:, :2], None)]] * 2, [("a", full, None)], None, {})
    assert localize.summary(nothing).startswith("not localized: none of the 1 module outputs could be compared "
                                                "(cannot gather")
    clean = localize.localize([[("a", full, None)]], [("a", full, None)], None, {})
    assert localize.summary(clean) == "none: every module within its limit"


def test_a_wrong_attention_backward_is_said_of_the_attention():
    """In backward order the first module whose gradient diverges is a child (`attn.norm_q`), and the gradient it
    received was already wrong: the attention's backward, between its children, is where it began. The attention
    module itself has no backward record (called with keyword arguments only), so the forward says it ran."""
    good, bad = torch.ones(1, 4, 2), torch.ones(1, 4, 2) * 1.01
    single = [("attn.to_out.0", good, good), ("attn.norm_q", good, good), ("attn.to_q", good, good)]
    ranks = [[("attn.to_out.0", good, good), ("attn.norm_q", bad, bad), ("attn.to_q", bad, bad)]]
    assert localize.localize(ranks, single, None, {}, gradients=True).line.startswith("attn.norm_q:")
    named = localize.localize(ranks, single, None, {}, gradients=True, called={"attn", "attn.norm_q"})
    assert named.line.startswith("attn (first seen at its norm_q):")
    clean = localize.localize([[("x", good, None)]], [("x", good, None)], None, {})
    assert localize.summary(clean, named).startswith("backward: attn (first seen at its norm_q)")


def test_what_every_data_parallel_group_holds_alike_is_one_groups():
    """A positional embedding is not split by sample: each data-parallel group holds the same sequence shards."""
    rope = torch.arange(12.0).reshape(1, 6, 2)
    pieces = [rope[:, :3], rope[:, 3:]] * 2
    found = localize.localize([[("rope", piece, None)] for piece in pieces], [("rope", rope, None)], None, {},
                              data_parallel=2)
    assert found.uncompared == [] and found.modules[0]["error"] == 0.0


def test_a_first_dimension_that_merely_divides_is_not_taken_for_samples():
    """Flux's positional embedding is (sequence, dim), the same on every data-parallel group: its first dimension
    divides by the groups, but split that way it would be wrong; as one group holds it, it is right."""
    freqs = torch.arange(16.0).reshape(8, 2)
    pieces = [freqs[:4], freqs[4:]] * 2
    found = localize.localize([[("pos_embed", piece, None)] for piece in pieces], [("pos_embed", freqs, None)],
                              None, {}, data_parallel=2)
    assert found.modules[0]["error"] == 0.0 and found.line is None


# ------------------------------------------------------------------ what the line says when no module diverges


def _none_found():
    good = torch.ones(1, 4, 2)
    return localize.localize([[("a", good, None)]], [("a", good, None)], None, {})


def test_a_backward_that_was_not_traced_is_never_none():
    line = localize.summary(_none_found(), None, "backward not traced: AttributeError: boom")
    assert line == "not localized: every module within its limit in the forward; backward not traced: " \
                   "AttributeError: boom"
    assert localize.summary(_none_found()) == "none: every module within its limit"  # its clean twin


def _failed_case(single_value: float, limit: float = 1e-5):
    from harness.core.evidence import Evidence
    from harness.core.figures import SINGLE_DEVICE, FigureSpec
    from harness.core.results import CaseResult, Status

    result = CaseResult("flux/ulysses2/native/fp32/tensor+rope_sign", "flux", "default", "tensor", "ulysses2", 2,
                        "native", "fp32", Status.FAIL)
    result.evidence = [Evidence("max_abs_err", "max abs err 0.0185 > tolerance 1e-05", value=0.0185,
                                limit=1e-5).to_dict()]
    result.figures = [FigureSpec("single_max_abs_err", "max abs err of the single-device run (same dtype)",
                                 role=SINGLE_DEVICE).of(single_value, limit)]
    return result


def test_a_fault_the_single_device_run_shares_is_named_as_such_not_none():
    from harness.core.records import Localization
    from harness.run.divergence import first_divergence

    found = Localization(_none_found(), summary="none: every module within its limit")
    shared = first_divergence(_failed_case(0.0185), found)
    assert shared.startswith("none between the layout and one device, and the single-device fp32 run is off the "
                             "reference as far (max abs err of the single-device run (same dtype) 0.0185 > 1e-05): "
                             "the model, the backend or the compiler changed, not the parallelism")
    unexplained = first_divergence(_failed_case(1e-7), found)  # one device is right: the layout's own failure
    assert unexplained.startswith("not localized: every module within its limit, yet the case fails (max abs err "
                                  "0.0185 > tolerance 1e-05)")
    passing = _failed_case(1e-7)
    passing.evidence = []
    assert first_divergence(passing, found) == "none: every module within its limit"  # --localize on a PASS


def test_a_backward_hook_that_breaks_the_backward_is_found_and_left_out():
    """Two modules of twenty whose full backward hook makes the backward raise (as DTensor's redistribute backward
    does on QwenImage under tensor parallelism) are found by halving, and the rest is traced."""
    class Breaks(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, module):
            ctx.module = module
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if ctx.module._backward_hooks:  # a hook on this module: the backward cannot run (as DTensor's)
                raise AttributeError("'Tensor' object has no attribute '_local_tensor'")
            return grad, None

    class Fragile(torch.nn.Linear):
        def forward(self, x):
            return Breaks.apply(super().forward(x), self)

    model = torch.nn.Sequential(*(Fragile(2, 2) if index in (5, 13) else torch.nn.Linear(2, 2) for index in range(20)))
    records, grads, left_out = localize.trace_backward(
        model, lambda: model(torch.ones(1, 2, requires_grad=True)).sum())
    assert left_out == ["5", "13"]
    assert {name for name, _, _ in grads} == {str(index) for index in range(20)} - {"5", "13"}
    assert len(records) == 20 and all(parameter.grad is None for parameter in model.parameters())  # nothing left


def test_a_compiled_case_that_fails_where_eager_and_regional_compile_are_clean_blames_compiling():
    from dataclasses import replace

    from harness.core.records import Localization
    from harness.run.divergence import first_divergence

    found = Localization(_none_found(), summary="none: every module within its limit; under compile: each repeated "
                                                "block (FluxTransformerBlock) compiled, the forward traced: every "
                                                "module within its limit there too")
    compiled = replace(_failed_case(1e-7), mode="compile")
    assert first_divergence(compiled, found).startswith("the divergence comes from compiling, not narrowed: every "
                                                        "module within its limit; under compile")
    assert first_divergence(_failed_case(1e-7), found).startswith("not localized")  # eager: not the compiler's


def test_a_case_that_failed_only_what_one_device_measures_is_not_localized():
    """What a flow's calls did and whether a cache reused are one device's alone: no module of the ranks' run can be
    where they went wrong, so such a FAIL is not rerun to localize; one that also failed the numbers is."""
    from harness.core.evidence import Evidence
    from harness.run.runner import _to_localize

    result = _failed_case(0.0)
    assert _to_localize(result, every=False)
    numbers = list(result.evidence)
    result.evidence = [Evidence("flow_equals", "one device differs by 0.2").to_dict(),
                       Evidence("cache_reuse", "the cache reused nothing").to_dict()]
    assert not _to_localize(result, every=False)
    result.evidence += numbers
    assert _to_localize(result, every=False)
