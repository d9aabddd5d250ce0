"""The flow axis: what users call around `enable_parallelism` (harness.flows), before it or after it. The registry,
ids, plan and refusals without processes; one torchrun run of 2 ranks for what only real ranks show: every outcome
told apart (same numbers, diffusers' refusal, a crash, a silent wrong result) and the two flow controls failing where
their clean twins pass."""

from dataclasses import replace

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
    with pytest.raises(HarnessError, match="unknown flow 'lora_before'; valid flows: none, .*, all \\(did you mean "
                                           "'lora_fused'\\?\\)"):
        _plan(["ulysses2"], ["lora_before"])


def test_a_flow_is_registered_once_and_never_named_like_a_position():
    with pytest.raises(ValueError, match="registered twice"):
        registry.flow(registry.Call("again"))(flows.REGISTERED["lora"].code)

    def thing_after(module, setting):
        return None

    with pytest.raises(ValueError, match="named like an axis value"):
        registry.flow(registry.Call("x"))(thing_after)

    def several(module, setting):  # two calls declared, and no step between them to take the output at
        return None

    with pytest.raises(ValueError, match="declares 2 calls: .* a generator that yields after each"):
        registry.flow(registry.Call("a"), registry.Call("b"))(several)


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
    # a loader users call on the pipeline: Flux2's transformer has the IP-Adapter loader, its pipeline does not
    from harness.catalogue.zoo import get_spec

    flux2 = Case("flux2", parse_layout("ulysses2"), "native", "fp32", flow="ip_adapter")
    assert scope.unavailable(flux2, get_spec("flux2").model_class()) == \
        "this diffusers' Flux2Pipeline has no load_ip_adapter (the ip_adapter flow)"
    assert scope.unavailable(replace(flux2, model="flux"), get_spec("flux").model_class()) is None


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
    ids = set(_plan(["ulysses2"], ["none", "lora", "add_adapter", "fused_qkv", "cpu_offload", "cache_mag"],
                    kinds=("tensor", "image", "train")))
    assert {"flux/ulysses2/native/fp32/image/lora", "flux/ulysses2/native/fp32/train/add_adapter",
            "flux/ulysses2/native/fp32/image/cpu_offload", "flux/ulysses2/native/fp32/tensor/fused_qkv",
            "flux/ulysses2/native/fp32/image/cache_mag"} <= ids  # a picture's cache: through the pipeline's loop
    assert not {"flux/ulysses2/native/fp32/image/fused_qkv", "flux/ulysses2/native/fp32/train/lora",
                "flux/ulysses2/native/fp32/image/add_adapter", "flux/ulysses2/native/fp32/tensor/cpu_offload",
                "flux/ulysses2/native/fp32/train/cache_mag"} & ids


def test_regional_compilation_as_a_call_runs_in_eager_mode_where_the_model_has_repeated_blocks(monkeypatch):
    """The flow compiles the model itself: a compiled mode would compile it twice (N/A), and it asks what the
    `regional` mode asks of a model (its repeated blocks), and is timed as that mode is."""
    from harness.catalogue.zoo import get_spec
    from harness.core.modes import mode_of

    def planned():
        return {p.case.case_id: p.skip_reason for p in build_plan(
            ["flux"], ["ulysses2"], ["native"], ["fp32"], kinds=["tensor"], cpu_max_ranks=4,
            more={"flow": ["regional_compile"], "mode": ["eager", "compile"]}, compile_cases=("*",))}

    reasons = planned()
    assert reasons["flux/ulysses2/native/fp32/tensor/regional_compile"] is None
    assert reasons["flux/ulysses2/native/fp32/tensor/regional_compile/compile"] == \
        "the regional_compile flow compiles the model itself: the compile mode would compile it again"
    assert flows.compiled_by("regional_compile") == "regional" and flows.compiled_by("lora") is None
    assert mode_of(flows.compiled_by("regional_compile")).timeout_factor > 1
    monkeypatch.setattr(get_spec("flux").model_class(), "_repeated_blocks", [])
    assert "declares no _repeated_blocks" in planned()["flux/ulysses2/native/fp32/tensor/regional_compile"]


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


def _facts(calls, effect, changes_numbers=True, **more) -> dict:
    return {"position": "before", "changes_numbers": changes_numbers, "effect": effect,
            "calls": [{"text": f"model.call_{index}(x=1)", "declared": declared, "moved": moved}
                      for index, (declared, moved) in enumerate(calls)], **more}


def _judged(facts, per_rank=None):
    from types import SimpleNamespace

    from harness.run import flow_checks

    result = SimpleNamespace(extra={})
    found = flow_checks.failures(result, SimpleNamespace(metrics={"flow": facts}, flow_changes=per_rank), 1e-5)
    return found, result.extra["blocks"][0]


@pytest.mark.parametrize(("calls", "failed"), [
    ([("changes", 0.3), ("changes", 1e-6)], "call 2 (model.call_1(...)) moved one device's output by 1e-06, within"),
    ([(None, 0.0), ("changes", 0.1)], None),
    ([("keeps", 0.3)], "call 1 (model.call_0(...)) moved one device's output by 0.3, beyond the limit"),
    ([("keeps", 1e-7)], None)])
def test_each_call_is_held_to_what_it_declares_and_named_when_it_did_not(calls, failed):
    """A call declared to change one device's output that moved it within the limit did nothing the case could
    compare (a hot swap that swapped in nothing); one declared to keep it that moved it did something else."""
    found, block = _judged(_facts(calls, 0.3, changes_numbers=any(d == "changes" for d, _ in calls)))
    named = [row[0] for row in block["rows"][:len(calls)]]
    assert named == [f"{index + 1}. model.call_{index}(x=1)" for index in range(len(calls))]
    if failed is None:
        assert found == []
    else:
        assert [item.check for item in found] == ["flow_effect"] and found[0].text.startswith(failed)


def test_the_flow_must_equal_the_model_it_stands_for_and_every_rank_change_the_model_as_one_device():
    changes = ["a.to_q: Linear became Linear", "a: hook x added"]
    facts = _facts([("changes", 0.1)], 0.1, equals={"text": "the second LoRA loaded directly", "diff": 0.02},
                   one_device_changes=changes)
    found, block = _judged(facts, [changes, changes[:1]])
    assert [item.check for item in found] == ["flow_equals", "flow_calls"]
    assert found[0].text == ("after the calls one device differs from the second LoRA loaded directly by 0.02 "
                             "(limit 1e-05)")
    assert found[1].text == ("rank 1's calls changed the model otherwise than one device's: 1 of one device's 2 "
                             "changes missing, first: a: hook x added")
    assert ["against the second LoRA loaded directly", "one device differs by 0.02", "equals it", "no"] in block["rows"]
    assert _judged({**facts, "equals": {**facts["equals"], "diff": 0.0}}, [changes, changes])[0] == []


def test_a_flow_whose_one_device_run_failed_cannot_be_judged():
    found, block = _judged({**_facts([("changes", None)], None), "error": "ValueError: no"})
    assert [item.check for item in found] == ["cannot_judge"] and "ValueError: no" in found[0].text


def test_calls_are_made_in_order_and_a_rank_may_be_made_to_leave_the_last_out(monkeypatch):
    """A flow's code runs call by call (one device's output is taken between them); a control's fault makes a rank
    leave calls out, and a code that makes more or fewer calls than it declares is the harness's error."""
    from types import SimpleNamespace

    from harness.flows import calls

    made = []

    def three(module, setting):
        for name in ("a", "b", "c"):
            made.append(name)
            yield

    flow = registry.Flow("three", tuple(registry.Call(name) for name in "abc"), three)
    between = []
    assert calls.make(flow, SimpleNamespace(named_modules=lambda: []), None,
                      lambda index, call: between.append((index, call.text, list(made)))) == []
    assert between == [(0, "a", ["a"]), (1, "b", ["a", "b"])]
    made.clear()
    monkeypatch.setattr(calls, "to_make", lambda found: len(found.calls) - 1)
    calls.make(flow, SimpleNamespace(named_modules=lambda: []), None)
    assert made == ["a", "b"]  # the last call was never made
    monkeypatch.undo()
    short = registry.Flow("short", (registry.Call("a"), registry.Call("b")), lambda module, setting: iter([None]))
    with pytest.raises(HarnessError, match="declares 2 calls and its code made 1"):
        calls.make(short, SimpleNamespace(named_modules=lambda: []), None)


def test_a_flow_control_runs_where_no_known_issue_or_a_wrong_result_stands_behind_its_clean_twin():
    """Tensor parallelism first; past a layout with a known issue, and past a known crash where every layout has
    one: a crash's entry would excuse the very crash a rank that left the calls out provokes on the rank that made
    them (an IP-Adapter loaded after parallelism: `tp2` crashes, context parallelism is silently wrong)."""
    from harness.run import flow_controls

    def layout(levels):
        def known(case_id):
            return next((level for name, level in levels.items() if f"/{name}/" in case_id), 0)

        return flow_controls.generate(["ip_adapter_after"], known)[0].case.layout.name

    assert layout({}) == "tp2"
    assert layout({"tp2": 1}) == "ulysses2"
    assert layout({"tp2": 2, "ulysses2": 1, "ring2": 1}) == "ulysses2"
    assert layout({"tp2": 1, "ulysses2": 2, "ring2": 2}) == "tp2"
    assert layout({"tp2": 2, "ulysses2": 2, "ring2": 2}) == "tp2"  # a crash everywhere: the first, as before


def test_what_calls_change_of_a_model_is_told_by_module_and_compared_by_line():
    """A processor set anew, a hook added, a LoRA layer in a projection's place, a parameter frozen or cast: what a
    rank that left a call out lacks, whatever the numbers say."""
    import torch

    from harness.flows import state

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.to_q, self.processor = torch.nn.Linear(2, 2), object()

    model = torch.nn.Sequential(Attention())
    before = state.snapshot(model)
    model[0].processor = object()
    model[0].to_q.weight.requires_grad_(False)
    model[0].to_q.bias.data = model[0].to_q.bias.data.to(torch.bfloat16)
    model[0].add_module("to_k", torch.nn.Linear(2, 2))
    assert state.changes(before, state.snapshot(model)) == [
        "0: processor replaced (object by object)", "0.to_q: parameter weight frozen",
        "0.to_q: parameter bias cast from float32 to bfloat16", "0.to_k: added (Linear)"]
    # replaced twice, the first freed at once: the third may be allocated where the first was, and is still another
    class Processor:
        pass

    model[0].processor = Processor()
    before = state.snapshot(model)
    model[0].processor = Processor()
    model[0].processor = Processor()
    assert state.changes(before, state.snapshot(model)) == ["0: processor replaced (Processor by Processor)"]
    # regional compilation compiles each block in place (nn.Module.compile; nothing is traced before it runs)
    before = state.snapshot(model)
    model[0].compile()
    assert state.changes(before, state.snapshot(model)) == ["0: compiled (torch.compile)"]
    assert state.compared(["x"], ["x"]) is None
    assert state.compared([], ["x", "y"]) == "2 of one device's 2 changes missing, first: x"


# --- one real run: 2 ranks ------------------------------------------------------------------------------------------

RUN = [("ulysses2", "lora_scaled", None), ("ulysses2", "lora_scaled", "lora_scale_one_rank"),
       ("ulysses2", "fused_qkv", None), ("ulysses2", "fused_qkv", "fused_qkv_one_rank"),
       ("ulysses2", "processor", None), ("ulysses2", "processor_after", None), ("tp2", "lora_after", None),
       ("tp2", "add_adapter_after", None), ("ulysses2", "lora_unload", None), ("tp2", "lora_unload", None),
       ("ulysses2", "lora_hotswap_after", None), ("ulysses2", "ip_adapter_scaled", None),
       ("ulysses2", "ip_adapter_unload_after", None), ("tp2", "ip_adapter", None),
       ("ulysses2", "regional_compile", None), ("ulysses2", "regional_compile", "flow_calls_rank0_only")]
# The image kind's LoRA and the train kind's adapter, each beside its control: the adapter doubled on rank 1
KINDS_RUN = [("image", "lora", None), ("image", "lora", "adapter_other_ranks"), ("train", "add_adapter", None),
             ("train", "add_adapter", "adapter_other_ranks"), ("image", "ip_adapter", None),
             ("image", "ip_adapter_after", None)]


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


def _called(result) -> list[list]:
    """The rows of the case's block of what the user called."""
    return next(block for block in result.extra["blocks"] if block["title"].startswith("What the user called"))["rows"]


def _moved(row) -> float:
    return float(row[1].removeprefix("moved one device's output by "))


@pytest.mark.slow
def test_a_flow_is_judged_against_one_device_making_the_same_calls(flowed):
    result = flowed["flux/ulysses2/native/fp32/tensor/lora_scaled"]
    assert result.status is Status.PASS, result.reason
    rows = _called(result)
    # the LoRA did move the numbers, then its scale did, and the layout matched them; halving lora_B does the same
    assert [_moved(row) > 1e-3 for row in rows[:2]] == [True, True] and rows[2][0] == "the calls, in all"
    assert rows[3][0] == "against the LoRA loaded with its lora_B weights times 0.5" and rows[3][3] == "yes"


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
        assert not any(item["check"] == "flow_effect" for item in result.evidence)
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
    unload = _called(flowed["flux/ulysses2/native/fp32/tensor/lora_unload"])
    assert unload[3][:2] == ["against the plain model", "one device differs by 0"]
    # the swap moved one device's output, as far as the second LoRA's own effect, and equals it loaded directly
    swap = _called(flowed["flux/ulysses2/native/fp32/tensor/lora_hotswap_after"])
    assert swap[2][0].startswith("3. model.load_lora_adapter(<another seeded LoRA") and _moved(swap[2]) > 1e-2
    assert swap[4][0] == "against the second LoRA loaded directly" and swap[4][3] == "yes"


@pytest.mark.slow
def test_an_ip_adapter_passes_loaded_before_context_parallelism_and_is_lost_or_crashes_otherwise(flowed):
    scaled = flowed["flux/ulysses2/native/fp32/tensor/ip_adapter_scaled"]
    assert scaled.status is Status.PASS, scaled.reason
    rows = _called(scaled)  # the adapter moved one device's output, its scale did, and halving its values does the same
    assert [_moved(row) > 1e-2 for row in rows[:2]] == [True, True]
    assert rows[3][0] == "against the IP-Adapter loaded with its value projections times 0.5" and rows[3][3] == "yes"
    lost = flowed["flux/ulysses2/native/fp32/tensor/ip_adapter_unload_after"]  # fresh processors after CP: none has it
    assert lost.status is Status.FAIL and "0 all_to_all" in lost.reason and "> tolerance" in lost.reason
    crashed = flowed["flux/tp2/native/fp32/tensor/ip_adapter"]  # the IP processor splits all heads on a rank's share
    assert crashed.status is Status.ERROR and "Given normalized_shape" in crashed.reason
    # the picture through FluxPipeline's own call, given the image's embeddings: one device's with the adapter, and
    # without context parallelism's exchanges where it was loaded after it
    picture = flowed["flux/ulysses2/native/fp32/image/ip_adapter"]
    assert picture.status is Status.PASS and _moved(_called(picture)[0]) > 1e-2, picture.reason
    lost_picture = flowed["flux/ulysses2/native/fp32/image/ip_adapter_after"]
    assert lost_picture.status is Status.FAIL and "0 all_to_all" in lost_picture.reason


@pytest.mark.slow
def test_regional_compilation_before_parallelism_is_proven_from_its_graphs_and_a_rank_left_eager_is_seen(flowed):
    """compile_repeated_blocks(fullgraph=True), then enable_parallelism: the blocks' graphs hold the exchanges and
    the attention kernel (the compiled proof, not the eager recorder); a rank that left the call out runs its blocks
    eager, with the same numbers, and its record of the calls tells it."""
    compiled = flowed["flux/ulysses2/native/fp32/tensor/regional_compile"]
    assert compiled.status is Status.PASS, compiled.reason
    assert compiled.figure("graphs") >= 1 and compiled.figure("graph_breaks") == 0
    assert "all_to_all" in compiled.comms and "flash_attention" in compiled.kernels
    assert _called(compiled)[2][1].endswith("first: transformer_blocks.0: compiled (torch.compile)")
    eager_rank = flowed["flux/ulysses2/native/fp32/tensor/regional_compile+flow_calls_rank0_only"]
    assert eager_rank.status is Status.FAIL and any(item["check"] == "flow_calls" for item in eager_rank.evidence), \
        eager_rank.reason


TOY = '''
"""A flow of one's own whose call changes nothing a rank could leave out: its generated control must PASS."""

from harness.flows import KEEPS, Call, flow


@flow(Call("model.eval(): a call that leaves the model as it was", KEEPS))
def toy_nothing(module, setting):
    module.eval()
'''


@pytest.mark.slow
def test_a_flow_whose_control_passes_is_named_as_testing_nothing(project, monkeypatch):
    """The generated control's own negative control: a flow added through `HARNESS_FLOWS` whose calls change nothing
    is run by every rank, planned, judged, and `harness selftest --flows` names it and exits 1."""
    import os
    import subprocess
    import sys

    (project / "toy_flow.py").write_text(TOY)
    monkeypatch.setenv("PYTHONPATH", f"{project}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("HARNESS_FLOWS", "toy_flow")
    done = subprocess.run([sys.executable, "-m", "harness", "selftest", "--flows", "toy_nothing,lora",
                           "--report-dir", "out"], cwd=project, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("  MISSED", "  caught"))]
    assert [row[:2] for row in rows] == [["MISSED", "toy_nothing"], ["caught", "lora"]], done.stdout
    assert "faulty PASS" in " ".join(rows[0])
    assert "flows whose control was not caught (they test nothing): toy_nothing (all calls)" in done.stdout


def test_what_a_flow_did_is_held_to_fp32s_limit_in_a_low_precision_case_too():
    """The calls' effect and the model they must equal are measured on one device in fp32 whatever the case's dtype:
    a bf16 case's own tolerance (0.15) let a cache whose one-device run is 0.02 off the model it must equal pass."""
    from harness.core.layouts import parse_layout
    from harness.core.records import Case, CaseRecord, Outcome
    from harness.core.results import Status
    from harness.run.settings import load_settings
    from harness.run.verdict import judge
    from tests.judging import ROOT

    limits = load_settings({"tensor_limits": {"fp32": 1e-5, "bf16": 0.15, "fp16": 0.15}}, start=ROOT)
    noise = {"nudged:1": 7.8e-3, "nudged:2": 7.8e-3, "math_kernel": 2.0e-3, "split_reduction": 7.8e-3}
    case = Case("flux", parse_layout("ulysses2"), "native", "bf16", flow="cache_pab")
    judged = []
    for diff in (0.0, 0.02):
        facts = _facts([("changes", 0.1)], 0.1, equals={"text": "the same cache on a model of its own", "diff": diff})
        metrics = {"max_abs_err": 1.0e-2, "mean_abs_err": 2.7e-3, "max_rel_err": 1e-3, "nonfinite": 0,
                   "baseline": {"mean_abs_err": 2.67e-3, "max_abs_err": 1.0e-2}, "vs_baseline_max_abs": 3.9e-3,
                   "noise": noise, "flow": facts}
        record = CaseRecord(case.case_id, seconds=0.1, dispatched={"native": 2}, metrics=metrics)
        judged.append(judge(Outcome(case, record), limits))
    assert judged[0].status is Status.PASS, judged[0].reason
    assert judged[1].status is Status.FAIL and [item["check"] for item in judged[1].evidence] == ["flow_equals"]
    assert "by 0.02 (limit 1e-05)" in judged[1].reason
