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
    assert found["first"] == 2 and found["line"] == "b: rel err 5.0e-01 > 1.0e-04 (previous 0.0e+00)"


def test_a_divergence_between_children_is_said_of_the_module_around_them():
    good, bad = torch.ones(1, 4, 2), torch.ones(1, 4, 2) * 2
    single = [("attn.to_q", good, good), ("attn.to_out.0", good, good), ("attn", good, good)]
    ranks = [[("attn.to_q", good, good), ("attn.to_out.0", bad, bad), ("attn", bad, good)]]
    assert localize.localize(ranks, single, None, {})["line"].startswith("attn (first seen at its to_out.0):")


def test_low_precision_is_measured_against_its_own_dtype_on_one_device():
    expected, noisy = torch.ones(1, 4, 2), torch.ones(1, 4, 2) * 1.01
    single = [("a", expected, None)]
    own = [("a", noisy, None)]  # the dtype alone is 1% off here
    assert localize.localize([[("a", noisy, None)]], single, own, {})["first"] is None
    assert localize.localize([[("a", expected * 1.2, None)]], single, own, {})["first"] == 0
    assert localize.localize([[("a", noisy, None)]], single, None, {})["first"] == 0  # fp32 would call it broken
