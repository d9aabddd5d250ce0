"""The communication proof: the recorder on real collectives (one gloo rank), the prediction on real tiny models, the
check, and its place in the verdict. The deliberate bugs it catches in real launches are in the selftest controls
(test_negative_controls.py)."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from harness.core.layouts import parse_layout
from harness.core.records import Case, CaseRecord, Outcome
from harness.core.results import Status
from harness.rank.comms_check import by_pattern, comms_mismatch, predict, totals
from harness.rank.recorder import BACKWARD, OUTSIDE, RunRecorder
from harness.run.known_issues import KnownIssue
from harness.run.verdict import apply_known_issues, judge
from tests.judging import settings


@pytest.fixture(scope="module")
def one_rank():
    """A one-rank gloo group: every collective runs for real (and returns its input)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


class Gathers(torch.nn.Module):
    def forward(self, x):
        return funcol.all_to_all_single_autograd(x, None, None, dist.group.WORLD)


class CrossAttention(torch.nn.Module):
    def forward(self, hidden_states, encoder_hidden_states=None):
        return hidden_states


class Root(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gathers, self.layer, self.cross = Gathers(), torch.nn.Linear(4, 4), CrossAttention()
        # Like RowwiseParallel: the all-reduce runs in a forward hook registered before any recording starts.
        self.layer.register_forward_hook(lambda mod, args, out: funcol.all_reduce(out, "sum", dist.group.WORLD))

    def forward(self, x):
        gathered = [torch.empty_like(x)]
        dist.all_gather(gathered, x.detach())  # a plain torch.distributed call, as diffusers gathers masks
        self.cross(x, x)  # positionally, as Wan calls attn2
        self.cross(x)
        self.cross(x, encoder_hidden_states=x)
        return self.layer(self.gathers(x))


def test_recorder_counts_each_collective_at_its_innermost_module(one_rank):
    model, x = Root(), torch.ones(2, 4, requires_grad=True)
    with RunRecorder(model) as recorder:
        model(x).wait().sum().backward()
        funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD).wait()
    assert recorder.recorded() == {
        "": {"all_gather": [1, 32]},
        "gathers": {"all_to_all": [1, 32]},
        "layer": {"all_reduce": [1, 32]},  # the module's own hook ran inside the module
        BACKWARD: {"all_reduce": [1, 32], "all_to_all": [1, 32]},  # both differentiable ones, backwards
        OUTSIDE: {"all_reduce": [1, 12]},
    }
    assert recorder.calls["cross"] == 3 and recorder.context_calls["cross"] == 2
    assert not model.layer._forward_pre_hooks and len(model.layer._forward_hooks) == 1  # its own hooks left alone


def _recorder(calls, context_calls=None):
    return SimpleNamespace(calls=calls, context_calls=context_calls or {})


@pytest.fixture(scope="module")
def flux():
    from harness.catalogue.zoo import get_spec

    return get_spec("flux").build()


FLUX_CALLS = {"": 1, "transformer_blocks.0.attn": 1, "single_transformer_blocks.0.attn": 2, "proj_out": 1,
              "transformer_blocks.0.attn.to_out.0": 1, "single_transformer_blocks.0.proj_out": 2}


def _minimums(model, layout, calls=FLUX_CALLS, plan=None, context_calls=None):
    expected = predict(model, parse_layout(layout), plan, _recorder(calls, context_calls))
    return {(e.module, e.collective): e.at_least for e in expected}


def test_prediction_from_the_layout_and_the_plans(flux):
    attention = ("transformer_blocks.0.attn", "single_transformer_blocks.0.attn")
    assert _minimums(flux, "ulysses2") == {(attention[0], "all_to_all"): 4, (attention[1], "all_to_all"): 8,
                                           ("proj_out", "all_gather"): 1}
    assert _minimums(flux, "ring4") == {(attention[0], "all_gather"): 1, (attention[1], "all_gather"): 2,
                                        ("proj_out", "all_gather"): 1}
    assert set(_minimums(flux, "ring2xulysses2")) == {(a, c) for a in attention for c in ("all_gather", "all_to_all")
                                                      } | {("proj_out", "all_gather")}
    assert _minimums(flux, "tp2") == {("transformer_blocks.0.attn.to_out.0", "all_reduce"): 1,
                                      ("single_transformer_blocks.0.proj_out", "all_reduce"): 2}  # packed rowwise
    assert _minimums(flux, "single") == {}
    assert _minimums(flux, "ulysses2", calls={"proj_out": 1}) == {("proj_out", "all_gather"): 1}  # only what ran


def test_cross_attention_over_a_whole_context_needs_no_exchange():
    from harness.catalogue.zoo import get_spec

    wan = get_spec("wan").build()
    calls = {"blocks.0.attn1": 1, "blocks.0.attn2": 1}
    # Wan's plan splits the video tokens only: attn2 attends to the whole text on every rank.
    assert set(_minimums(wan, "ulysses2", calls, context_calls={"blocks.0.attn2": 1})) == {
        ("blocks.0.attn1", "all_to_all")}
    split_text = {"": {"encoder_hidden_states": object()}}  # a plan that splits the text: now attn2 must exchange
    assert set(_minimums(wan, "ulysses2", calls, plan=split_text, context_calls={"blocks.0.attn2": 1})) == {
        ("blocks.0.attn1", "all_to_all"), ("blocks.0.attn2", "all_to_all")}


def _expect(module, collective, at_least, why="why"):
    return {"module": module, "collective": collective, "at_least": at_least, "why": why}


def test_mismatch_names_each_missing_exchange():
    recorded = {"blocks.0.attn": {"all_to_all": [4, 64]}, "blocks.1.attn.inner": {"all_to_all": [4, 64]},
                "blocks.2.attn": {"all_gather": [1, 8]}, OUTSIDE: {"all_to_all": [9, 1]}}
    expected = [_expect(f"blocks.{i}.attn", "all_to_all", 4, "4 per call") for i in range(3)]
    assert comms_mismatch(expected[:2], recorded) is None  # a submodule's exchange is its parent's
    assert comms_mismatch(expected, recorded) == ("communication: 1 of 3 predicted exchanges missing: blocks.2.attn: "
                                                  "0 all_to_all, expected >= 4 (4 per call)")
    both = [_expect("blocks.2.attn", "all_gather", 1, "ring"), _expect("blocks.2.attn", "all_gather", 1, "gather")]
    assert "1 all_gather, expected >= 2 (ring + gather)" in comms_mismatch(both, recorded)
    many = [_expect(f"m{i}", "all_reduce", 1) for i in range(5)]
    assert comms_mismatch(many, recorded).endswith("; and 2 more")
    assert comms_mismatch(many, None) is None and comms_mismatch([], recorded) is None


def test_column_and_detail_views():
    recorded = {"blocks.0.attn": {"all_to_all": [4, 1500]}, "blocks.1.attn": {"all_to_all": [4, 1500]},
                "proj_out": {"all_gather": [1, 64]}}
    assert totals(recorded) == "all_gather:1 all_to_all:8 (3.06 kB)"
    assert totals({}) == "none"
    rows = by_pattern(recorded, [_expect("blocks.0.attn", "all_to_all", 4), _expect("blocks.1.attn", "all_to_all", 4)])
    assert rows[0] == {"modules": "blocks.*.attn", "count": 2, "recorded": {"all_to_all": [8, 3000]},
                       "expected": {"all_to_all": 8}}


def _outcome(comms, expected):
    case = Case("flux", parse_layout("ulysses2"), "native", "fp32")
    metrics = {"max_abs_err": 1e-7, "mean_abs_err": 1e-8, "max_rel_err": 1e-8, "nonfinite": 0}
    return Outcome(case, CaseRecord(case.case_id, seconds=0.1, dispatched={"native": 2}, metrics=metrics,
                                    comms=comms, comms_expected=expected))


def test_a_missing_exchange_is_a_proof_failure_no_known_issue_excuses():
    expected = [_expect("blocks.0.attn", "all_to_all", 4)]
    clean = judge(_outcome({"blocks.0.attn": {"all_to_all": [4, 64]}}, expected), settings())
    assert clean.status is Status.PASS and clean.comms == "all_to_all:4 (64 B)" and clean.extra["comms"]
    broken = judge(_outcome({}, expected), settings())
    assert broken.status is Status.FAIL and broken.reason.startswith("communication: 1 of 1")
    assert [item["check"] for item in broken.evidence] == ["proof.comms"]  # the numbers passed: nothing else
    issue = KnownIssue(match="flux/*", reason="listed", error_contains="communication")
    assert apply_known_issues(broken, [issue]).status is Status.FAIL
