"""Per-op numerics inside one module (harness.rank.opdiff, `--localize-ops`): the first aten op that differs
between two runs of the module, with its inputs' and output's figures, or where the two sequences of ops part."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.rank import opdiff


class _Scaled(torch.nn.Module):
    def __init__(self, factor: float = 2.0, extra: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.factor, self.extra = torch.nn.Linear(4, 4), factor, extra

    def forward(self, x):
        y = self.linear(x).relu() * self.factor
        return y.neg().neg() if self.extra else y


def _ops(module) -> list[dict]:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), module)
    x = torch.ones(2, 4)
    return opdiff.record(model, "1", lambda: model(x))


def test_only_the_modules_own_ops_are_recorded_and_equal_runs_agree():
    ops = _ops(_Scaled())
    assert [op["op"] for op in ops][-2:] == ["relu.default", "mul.Tensor"]
    assert sum(op["op"] == "addmm.default" for op in ops) == 1  # its own linear's, not the one before it
    assert opdiff.first_difference(ops, _ops(_Scaled())) is None
    assert opdiff.line(None, "1") == "every op inside 1 agrees"


def test_the_first_op_whose_output_moved_is_named_with_its_inputs():
    found = opdiff.first_difference(_ops(_Scaled(2.0 + 2**-20)), _ops(_Scaled()))
    line = opdiff.line(found, "1")
    assert line.startswith(f"aten.mul.Tensor, op {found['index'] + 1} of {found['count']} inside 1: output rel err ")
    assert line.endswith("(its inputs 0.0e+00)")  # what it computed from agrees: this op moved


def test_where_the_sequences_of_ops_part_is_said():
    found = opdiff.first_difference(_ops(_Scaled(extra=True)), _ops(_Scaled()))
    assert opdiff.line(found, "1").startswith("the ops inside 1 agree as far as both go (")
    assert "then here runs aten.neg.default and 1 more" in opdiff.line(found, "1")


def test_localize_ops_names_the_op_a_change_to_diffusers_adds_inside_its_module():
    """rope_sign turns flux's RoPE the other way: inside the attention the ops part where it negates the sine."""
    from harness.core.results import CaseResult, Status
    from harness.run.ops import localize_ops

    result = CaseResult("flux/single/native/fp32/tensor+rope_sign", "flux", "default", "tensor", "single", 1,
                        "native", "fp32", Status.FAIL)
    line = "transformer_blocks.0.attn (first seen at its to_out.0): rel err 1.8e-01 > 1.0e-14 (previous 0.0e+00)"
    result.extra["drift"] = {"line": line, "forward": {}}
    said = []
    localize_ops([result], Path(__file__).resolve().parents[2] / "references", said.append)
    assert "inside transformer_blocks.0.attn: aten.neg.default here" in result.extra["drift"]["ops"]
    assert said == [f"ops: flux@default tensor: {result.extra['drift']['ops']}"]
    clean = CaseResult("flux/single/native/fp32/tensor", "flux", "default", "tensor", "single", 1, "native", "fp32",
                       Status.PASS)
    clean.extra["drift"] = {"line": line, "forward": {}}
    localize_ops([clean], Path("unused"), said.append)  # this environment's own change: no other side here
    assert clean.extra["drift"]["ops"].startswith("per-op needs the reference's side running")
