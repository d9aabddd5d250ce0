"""The refusal kind: each invalid input must be refused with diffusers' own message. Refused so is the only PASS;
accepted and refused otherwise are FAILs naming the input; a case that could try nothing cannot be judged. On real
ranks, the clean case PASSes and a diffusers that silently ignores a misspelt plan input FAILs by that input alone
(the other inputs still refused), and the catalogue tries only what the installed release carries."""

from __future__ import annotations

import pytest

from harness.catalogue import refusals
from harness.core.figures import value
from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.core.results import CaseResult, Status
from harness.kinds import kind_of
from harness.run import runner
from harness.run.plan import PlannedCase, build_plan


def result() -> CaseResult:
    return CaseResult("flux/ulysses2/native/fp32/refusal", "flux", "default", "refusal", "ulysses2", 2, "native",
                      "fp32", Status.PASS)


def outcome(name: str, observed: str | None = None, **more) -> dict:
    return {"name": name, "what": f"the input {name}", "message": "must be >= 1",
            **({"observed": observed} if observed is not None else {}), **more}


def test_only_a_refusal_with_diffusers_message_passes():
    kind, case = kind_of("refusal"), result()
    metrics = {"layout_max_abs": 1e-7, "outcomes": [
        outcome("refused", "ValueError: `tp_degree` must be >= 1."),
        outcome("accepted"),
        outcome("otherwise", "AttributeError: 'NoneType' object has no attribute 'size'"),
        outcome("skipped", not_tried="this diffusers has no such refusal")]}
    found = kind.judge(case, metrics, None)
    assert [(item.check, item.subject) for item in found] == [("accepted", "accepted"),
                                                              ("refused_otherwise", "otherwise")]
    assert "diffusers accepted the input accepted" in found[0].text
    assert value(case.figures, "inputs_refused") == 1 and value(case.figures, "inputs_tried") == 3
    rows = case.extra["blocks"][0]["rows"]
    assert [row[2] for row in rows][1:] == ["accepted", "AttributeError: 'NoneType' object has no attribute 'size'",
                                            "not tried: this diffusers has no such refusal"]
    clean = result()  # the same inputs, all refused as they should be
    assert kind.judge(clean, {"layout_max_abs": 0.0, "outcomes": [outcome("refused", "ValueError: must be >= 1")]},
                      None) == []


def test_a_case_that_could_try_nothing_is_not_a_pass():
    found = kind_of("refusal").judge(result(), {"layout_max_abs": 0.0, "outcomes": [
        outcome("a", not_tried="this diffusers has no ring_anything")]}, None)
    assert [item.check for item in found] == ["cannot_judge"] and "ring_anything" in found[0].text


def test_each_invalid_input_is_tried_where_the_installed_release_refuses_it(monkeypatch):
    import diffusers
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    whole = {"": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3)},
             "rope": {0: ContextParallelInput(split_dim=0, split_output=True)},
             "proj_out": ContextParallelOutput(gather_dim=1)}
    assert diffusers.__version__ == "0.42.1"  # the release the catalogue was read from: each of its refusals is there
    assert [invalid.name for invalid in refusals.INVALID if refusals.not_tried(invalid, whole)] == []
    bare = {"": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3)}}
    assert refusals.not_tried(refusals.INVALID[-1], bare) == "the model's plan has nothing this changes"
    monkeypatch.setattr(refusals, "_source", lambda module: "")  # a release without the refusal's message
    assert "has no such refusal" in refusals.not_tried(refusals.INVALID[0], whole)


def test_context_parallel_inputs_on_cp_layouts_tensor_parallel_on_tp_and_one_case_per_layout():
    cp, tp = refusals.for_layout(parse_layout("ulysses2")), refusals.for_layout(parse_layout("tp2"))
    assert {invalid.family for invalid in cp} == {refusals.CP} and {invalid.family for invalid in tp} == {refusals.TP}
    kind = kind_of("refusal")
    assert not kind.applies(parse_layout("single")) and not kind.applies(parse_layout("dp2"))
    assert not kind.applies(parse_layout("tcp2")) and kind.applies(parse_layout("ring2"))
    plan = build_plan(["flux"], ["single", "ulysses2", "tp2"], ["native", "_native_flash"], ["fp32", "bf16"],
                      kinds=("refusal",))
    assert [p.case.case_id for p in plan] == ["flux/ulysses2/native/fp32/refusal", "flux/tp2/native/fp32/refusal"]


@pytest.mark.slow
def test_diffusers_refuses_each_and_a_silently_ignored_plan_input_fails_by_itself(project, settings_for):
    clean = [Case("flux", parse_layout(layout), "native", "fp32", kind="refusal") for layout in ("ulysses2", "tp2")]
    faulty = Case("flux", parse_layout("ulysses2"), "native", "fp32", kind="refusal",
                  fault="cp_plan_input_typo_ignored")
    summary = runner.run(settings_for(), [PlannedCase(case) for case in [*clean, faulty]], echo=print)
    results = {r.case_id: r for r in summary.results}
    for case in clean:
        got = results[case.case_id]
        assert got.status is Status.PASS, got.reason
        assert value(got.figures, "inputs_refused") == value(got.figures, "inputs_tried") > 0
    assert value(results[clean[0].case_id].figures, "inputs_tried") >= 13
    bad = results[faulty.case_id]
    assert bad.status is Status.FAIL, bad.reason
    assert [item["subject"] for item in bad.evidence] == ["plan_unknown_input"], bad.reason
    assert value(bad.figures, "inputs_refused") == value(bad.figures, "inputs_tried") - 1
    assert bad.first_divergence in (None, "")  # an accepted input is no module's output: not traced
