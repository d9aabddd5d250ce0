"""The flow axis: what users call around `enable_parallelism` (harness.flows), before it or after it. The registry,
ids, plan and refusals without processes; one torchrun run of 2 ranks for what only real ranks show: every outcome
told apart (same numbers, diffusers' refusal, a crash, a silent wrong result) and the two flow controls failing where
their clean twins pass."""

import pytest

from harness import flows
from harness.core import axes
from harness.core.errors import HarnessError
from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.core.results import Status
from harness.flows import registry, scope
from harness.run.plan import build_plan


def _plan(layouts, values, flow_cases=("*",), models=("flux",), loads=("enable",), kinds=("tensor",)):
    return {p.case.case_id: p for p in build_plan(list(models), list(layouts), ["native"], ["fp32"],
                                                  kinds=list(kinds), cpu_max_ranks=4,
                                                  more={"flow": list(values), "load": list(loads)},
                                                  flow_cases=flow_cases)}


def test_each_flow_is_an_axis_value_in_each_of_its_positions_and_none_stays_out_of_ids():
    assert set(flows.VALUES) >= {"none", "lora", "lora_after", "processor", "processor_after", "backend_after"}
    assert "backend" not in flows.VALUES and "reenable" not in flows.VALUES  # after-only flows
    values = {"model": "flux", "layout": "tp2", "backend": "native", "dtype": "fp32", "kind": "tensor"}
    assert axes.spell({**values, "flow": "none"}) == "flux/tp2/native/fp32/tensor"
    written = axes.spell({**values, "load": "pretrained", "flow": "lora_after", "mode": "compile"}, "f")
    assert written == "flux/tp2/native/fp32/tensor/pretrained/lora_after/compile+f"
    assert axes.parse(written)["flow"] == "lora_after" and axes.parse(written)["load"] == "pretrained"


def test_an_unknown_flow_is_refused_naming_the_valid_ones():
    with pytest.raises(HarnessError, match="unknown flow 'lora_before'; valid flows: none, "):
        _plan(["ulysses2"], ["lora_before"])


def test_a_flow_is_registered_once_and_never_named_like_a_position():
    with pytest.raises(ValueError, match="registered twice"):
        registry.flow("again")(flows.REGISTERED["lora"].call)

    def thing_after(module, setting):
        return None

    with pytest.raises(ValueError, match="named like an axis value"):
        registry.flow("x")(thing_after)


def test_a_flow_exists_on_its_layout_family_and_positions_only():
    ids = set(_plan(["single", "ulysses2", "tp2"], ["none", "reenable_after", "backend_after", "lora"]))
    assert "flux/ulysses2/native/fp32/tensor/reenable_after" in ids
    assert "flux/tp2/native/fp32/tensor/reenable_after" not in ids  # context parallelism only
    assert {"flux/single/native/fp32/tensor/lora", "flux/tp2/native/fp32/tensor/backend_after"} <= ids


def test_a_flow_runs_its_slice_only_and_nothing_comes_before_from_pretrained():
    plan = _plan(["ulysses2", "tp2"], ["none", "lora", "lora_after"], flow_cases=["flux/tp2/native/fp32/tensor"])
    assert sorted(plan) == ["flux/tp2/native/fp32/tensor", "flux/tp2/native/fp32/tensor/lora",
                            "flux/tp2/native/fp32/tensor/lora_after", "flux/ulysses2/native/fp32/tensor"]
    case = Case("flux", parse_layout("tp2"), "native", "fp32", load="pretrained", flow="lora")
    assert not scope.exists(case, checkpoint=True) and scope.exists(case, checkpoint=False)


def test_what_diffusers_refuses_is_read_from_its_source(monkeypatch):
    plan = _plan(["ulysses2", "tp2"], ["lora", "lora_after", "group_offload_after"])
    for case_id in ("flux/tp2/native/fp32/tensor/lora", "flux/tp2/native/fp32/tensor/lora_after",
                    "flux/tp2/native/fp32/tensor/group_offload_after"):
        refusal = plan[case_id].expected_refusal
        assert refusal is not None and refusal.checked and plan[case_id].runs, case_id
    assert plan["flux/ulysses2/native/fp32/tensor/lora"].expected_refusal is None  # CP takes a LoRA
    from harness.core import compat

    monkeypatch.setattr(compat, "source_of", lambda module: "")  # a release without the guard: judged on numbers
    assert scope.refusal(Case("flux", parse_layout("tp2"), "native", "fp32", flow="lora")) is None


def test_a_flow_whose_package_or_api_is_missing_is_a_skip_with_the_reason(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    skipped = _plan(["ulysses2"], ["lora"])["flux/ulysses2/native/fp32/tensor/lora"]
    assert skipped.skip_reason == "the lora flow needs peft, which is not installed"

    class Bare:
        pass

    case = Case("flux", parse_layout("ulysses2"), "native", "fp32", flow="fused_qkv")
    assert scope.unavailable(case, Bare) == "this diffusers' Bare has no fuse_qkv_projections (the fused_qkv flow)"


def test_the_quick_plan_has_a_flow_slice_of_flux_and_qwenimage():
    from harness.run.settings import preset

    quick = preset("quick")
    # processor_after fails the communication proof, which its known issue names exactly (XFAIL); First Block Cache
    # deadlocks under context parallelism (a TIMEOUT no entry excuses): --flows all runs it
    assert "processor_after" in quick["flows"] and not {"cache_fbc", "cache_fbc_after"} & set(quick["flows"])
    assert {"lora_after", "add_adapter_after", "none"} <= set(quick["flows"])
    assert "flux/tp2/native/fp32/tensor" in quick["flow_cases"]
    assert "qwenimage/ring2/_native_flash/fp32/tensor" in quick["flow_cases"]
    assert {"flux/ulysses2/native/fp32/image", "flux/tp2/native/fp32/train"} <= set(quick["flow_cases"])
    assert "qwenimage/ulysses2/native/fp32/train" not in quick["flow_cases"]


def test_the_image_and_train_kinds_take_the_flows_declared_for_them_only():
    ids = set(_plan(["ulysses2"], ["none", "lora", "add_adapter", "fused_qkv", "cpu_offload"],
                    kinds=("tensor", "image", "train")))
    assert {"flux/ulysses2/native/fp32/image/lora", "flux/ulysses2/native/fp32/train/add_adapter",
            "flux/ulysses2/native/fp32/image/cpu_offload", "flux/ulysses2/native/fp32/tensor/fused_qkv"} <= ids
    assert not {"flux/ulysses2/native/fp32/image/fused_qkv", "flux/ulysses2/native/fp32/train/lora",
                "flux/ulysses2/native/fp32/image/add_adapter", "flux/ulysses2/native/fp32/tensor/cpu_offload"} & ids


def test_a_pipeline_offload_needs_an_accelerator_and_tensor_parallelism_refuses_it(monkeypatch):
    monkeypatch.setattr(scope, "_has_accelerator", lambda: False)
    plan = _plan(["ulysses2", "tp2"], ["cpu_offload", "cpu_offload_after"], kinds=("image",))
    skipped = plan["flux/ulysses2/native/fp32/image/cpu_offload"]
    assert not skipped.runs and "this machine has none" in skipped.skip_reason
    monkeypatch.setattr(scope, "_has_accelerator", lambda: True)
    plan = _plan(["ulysses2", "tp2"], ["cpu_offload", "cpu_offload_after"], kinds=("image",))
    assert plan["flux/ulysses2/native/fp32/image/cpu_offload"].runs
    for position in ("cpu_offload", "cpu_offload_after"):  # read from the installed source, both orders
        refusal = plan[f"flux/tp2/native/fp32/image/{position}"].expected_refusal
        assert refusal is not None and refusal.checked, position


def test_a_train_flow_is_judged_against_one_device_training_with_the_same_calls():
    """The one-device run's losses, gradients and weights replace the file's (the batch stays); the effect is the
    largest relative change of a step's loss."""
    import torch

    from harness.core.reference import Reference
    from harness.kinds import kind_of

    reference = Reference("ref", {}, {}, torch.tensor([2.0, 1.0]), {},
                          {"noise": torch.ones(1), "grad.w": torch.zeros(1), "final.w": torch.zeros(1)})
    ran = {"losses": torch.tensor([2.0, 1.5], dtype=torch.float64), "gradients": {"w.lora_A": torch.ones(2)},
           "weights": {"w": torch.zeros(1), "w.lora_A": torch.ones(2)}}
    flowed, effect = kind_of("train").flow_reference(reference, ran)
    assert effect == pytest.approx(0.5)
    assert set(flowed.extras) == {"noise", "grad.w.lora_A", "final.w", "final.w.lora_A"}
    assert torch.equal(flowed.output, ran["losses"]) and torch.equal(reference.output, torch.tensor([2.0, 1.0]))


@pytest.mark.parametrize(("declared", "effect", "failed"), [
    ({"changes_numbers": True}, 1e-6, "did not do what the flow declares"), ({"changes_numbers": True}, 0.3, None),
    ({"keeps_numbers": True}, 0.3, "did not give the plain model back"), ({"keeps_numbers": True}, 1e-6, None)])
def test_a_flow_that_must_move_or_keep_the_numbers_is_held_to_it(declared, effect, failed):
    """A LoRA whose one-device run stays within the limit did nothing; an unload whose one-device run leaves it did
    not give the plain model back: `flow_effect` either way, from the same limit."""
    from types import SimpleNamespace

    from harness.run.verdict import _flow_failures

    facts = {"call": "x", "position": "before", "changes_numbers": False, **declared, "effect": effect}
    found = _flow_failures(SimpleNamespace(extra={}), {"flow": facts}, 1e-5)
    if failed is None:
        assert found == []
    else:
        assert [item.check for item in found] == ["flow_effect"] and failed in found[0].text


# --- one real run: 2 ranks ------------------------------------------------------------------------------------------

RUN = [("ulysses2", "lora_scaled", None), ("ulysses2", "lora_scaled", "lora_scale_one_rank"),
       ("ulysses2", "fused_qkv", None), ("ulysses2", "fused_qkv", "fused_qkv_one_rank"),
       ("ulysses2", "processor", None), ("ulysses2", "processor_after", None), ("tp2", "lora_after", None),
       ("tp2", "add_adapter_after", None), ("ulysses2", "lora_unload", None), ("tp2", "lora_unload", None),
       ("ulysses2", "lora_hotswap_after", None)]
# The image kind's LoRA and the train kind's adapter, each beside its control: the adapter doubled on rank 1
KINDS_RUN = [("image", "lora", None), ("image", "lora", "adapter_other_ranks"), ("train", "add_adapter", None),
             ("train", "add_adapter", "adapter_other_ranks")]


@pytest.fixture(scope="module")
def flowed(tmp_path_factory):
    """The cases above in one launch of 2 ranks, judged without known issues: what diffusers does, as it is."""
    from pathlib import Path

    from harness.run import runner
    from harness.run.plan import PlannedCase, expected_refusal
    from harness.run.settings import load_settings

    folder = tmp_path_factory.mktemp("flows")
    (folder / "pyproject.toml").write_text("[tool.harness]\n")
    empty = folder / "none.toml"
    empty.write_text("")
    # the repository's references: the image and train cases read theirs (the tensor ones are the zoo's too)
    settings = load_settings({"references": str(Path(__file__).resolve().parents[2] / "references"),
                              "report_dir": str(folder / "reports"), "known_issues": str(empty)}, start=folder)
    cases = [Case("flux", parse_layout(layout), "native", "fp32", flow=flow, fault=fault)
             for layout, flow, fault in RUN]
    cases += [Case("flux", parse_layout("ulysses2"), "native", "fp32", kind=kind, flow=flow, fault=fault)
              for kind, flow, fault in KINDS_RUN]
    plan = [PlannedCase(case, expected_refusal=expected_refusal(case)) for case in cases]
    summary = runner.run(settings, plan, echo=lambda line: None, localize_failures=False, purpose="selftest")
    return {result.case_id: result for result in summary.results}


@pytest.mark.slow
def test_a_flow_is_judged_against_one_device_making_the_same_calls(flowed):
    result = flowed["flux/ulysses2/native/fp32/tensor/lora_scaled"]
    assert result.status is Status.PASS, result.reason
    block = next(block for block in result.extra["blocks"] if block["title"] == "What the user called")
    effect = next(row[1] for row in block["rows"] if row[0].startswith("one device: the calls moved"))
    assert float(effect.split()[0]) > 1e-3  # the LoRA did move the numbers, and the layout matched them


@pytest.mark.slow
def test_the_flow_controls_fail_where_their_clean_twins_pass(flowed):
    scaled = flowed["flux/ulysses2/native/fp32/tensor/lora_scaled+lora_scale_one_rank"]
    assert scaled.status is Status.FAIL and "> tolerance" in scaled.reason  # rank 1's part of the gathered output
    assert flowed["flux/ulysses2/native/fp32/tensor/fused_qkv"].status is Status.PASS
    fused = flowed["flux/ulysses2/native/fp32/tensor/fused_qkv+fused_qkv_one_rank"]
    assert fused.status is Status.FAIL and "> tolerance" in fused.reason


@pytest.mark.slow
def test_a_processor_set_after_context_parallelism_is_a_silent_wrong_result(flowed):
    assert flowed["flux/ulysses2/native/fp32/tensor/processor"].status is Status.PASS
    after = flowed["flux/ulysses2/native/fp32/tensor/processor_after"]
    assert after.status is Status.FAIL and "0 all_to_all" in after.reason and "> tolerance" in after.reason


@pytest.mark.slow
def test_tensor_parallelism_refuses_a_loaded_lora_but_not_peft_add_adapter(flowed):
    refused = flowed["flux/tp2/native/fp32/tensor/lora_after"]
    assert refused.status is Status.REFUSED and "have a LoRA adapter loaded" in refused.reason
    added = flowed["flux/tp2/native/fp32/tensor/add_adapter_after"]
    assert added.status is Status.FAIL and "rank 1's output differs" in added.reason


@pytest.mark.slow
def test_a_lora_on_the_pipeline_and_an_adapter_in_training_match_one_device(flowed):
    picture = flowed["flux/ulysses2/native/fp32/image/lora"]
    trained = flowed["flux/ulysses2/native/fp32/train/add_adapter"]
    for result in (picture, trained):  # the flow moved one device's numbers beyond the limit, the layout matched them
        assert result.status is Status.PASS, result.reason
        assert not any(item.check == "flow_effect" for item in result.evidence)
    gradients = next(block for block in trained.extra["blocks"] if block["title"].startswith("Step-1 gradients"))
    assert all(".lora_" in row[0] for row in gradients["rows"])  # PEFT froze the model: only the adapter trains


@pytest.mark.slow
def test_an_adapter_that_differs_on_one_rank_fails_the_picture_and_the_training(flowed):
    picture = flowed["flux/ulysses2/native/fp32/image/lora+adapter_other_ranks"]
    assert picture.status is Status.FAIL, picture.reason
    trained = flowed["flux/ulysses2/native/fp32/train/add_adapter+adapter_other_ranks"]
    assert trained.status is Status.FAIL and "the ranks disagree" in trained.reason, trained.reason


@pytest.mark.slow
def test_an_unloaded_lora_gives_the_plain_model_back_and_a_hot_swap_matches_one_device(flowed):
    for case_id in ("flux/ulysses2/native/fp32/tensor/lora_unload", "flux/tp2/native/fp32/tensor/lora_unload",
                    "flux/ulysses2/native/fp32/tensor/lora_hotswap_after"):
        assert flowed[case_id].status is Status.PASS, (case_id, flowed[case_id].reason)
