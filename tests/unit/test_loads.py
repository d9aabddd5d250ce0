"""The load axis: `enable_parallelism` after the reference's weights, or `from_pretrained(folder,
parallel_config=...)` on a sharded checkpoint as diffusers' guide writes it, and the tensor-parallel combinations
diffusers refuses. Plan, ids and known issues without processes; one torchrun run of 2 ranks for what only a real
load shows (the shards checked against enable's, the 0.41+ crash, the refusals, the two loader controls)."""

from dataclasses import replace

import pytest

from harness.core import axes
from harness.core.errors import HarnessError
from harness.core.layouts import parse_layout
from harness.core.records import Case, CaseRecord, Outcome, case_id
from harness.core.results import Status
from harness.loads import ENABLE, LOADS, enable_id, guard, load_of
from harness.run.folders import launches_folder
from harness.run.known_issues import KnownIssue
from harness.run.plan import build_plan


def _plan(layouts, loads, kinds=("tensor",), load_cases=("*",), models=("flux",), backends=("native",)):
    return {p.case.case_id: p for p in build_plan(list(models), list(layouts), list(backends), ["fp32"],
                                                  kinds=list(kinds), cpu_max_ranks=4, more={"load": list(loads)},
                                                  load_cases=load_cases)}


def test_the_load_is_left_out_of_the_id_at_enable_and_written_after_the_kind():
    values = {"model": "flux", "layout": "tp2", "backend": "native", "dtype": "fp32", "kind": "tensor"}
    assert axes.spell(values) == axes.spell({**values, "load": ENABLE}) == "flux/tp2/native/fp32/tensor"
    assert axes.spell({**values, "load": "pretrained", "mode": "compile"}, "f") == \
        "flux/tp2/native/fp32/tensor/pretrained/compile+f"
    assert enable_id("flux/tp2/native/fp32/tensor/pretrained/compile+f") == \
        ("flux/tp2/native/fp32/tensor/compile+f", "pretrained")
    assert enable_id("flux/tp2/native/fp32/tensor") == ("flux/tp2/native/fp32/tensor", ENABLE)


def test_an_unknown_load_is_refused_naming_the_valid_ones():
    with pytest.raises(HarnessError, match="valid loads: enable, pretrained"):
        load_of("from_disk")
    with pytest.raises(HarnessError, match="unknown load"):
        _plan(["tp2"], ["from_disk"])


def test_each_load_exists_only_where_it_applies():
    plan = _plan(["single", "ulysses2", "tp2", "dp2"], list(LOADS), kinds=("tensor", "train"))
    ids = set(plan)
    assert "flux/tp2/native/fp32/tensor/tp_lora" in ids and "flux/ulysses2/native/fp32/tensor/tp_lora" not in ids
    assert "flux/ulysses2/native/fp32/tensor/pretrained_wrapped" in ids
    assert "flux/single/native/fp32/tensor/pretrained_wrapped" not in ids  # no config to wrap: it is `pretrained`
    assert "flux/dp2/native/fp32/train/pretrained" in ids and "flux/single/native/fp32/tensor/pretrained" in ids


def test_a_load_other_than_enable_runs_its_slice_only():
    plan = _plan(["ulysses2", "tp2"], ["enable", "pretrained"], load_cases=["flux/tp2/native/fp32/tensor"])
    assert sorted(plan) == ["flux/tp2/native/fp32/tensor", "flux/tp2/native/fp32/tensor/pretrained",
                            "flux/ulysses2/native/fp32/tensor"]


def test_the_quick_plan_holds_the_pretrained_slice_and_the_full_plan_every_model():
    from harness.catalogue.zoo import SPECS
    from harness.run.settings import preset

    quick = preset("quick")
    assert {"pretrained", "pretrained_wrapped"} <= set(quick["loads"])
    assert "qwenimage/ring2/_native_flash/fp32/tensor" in quick["load_cases"]
    assert "flux/tp2/native/fp32/train" in quick["load_cases"]
    assert {glob.split("/")[0] for glob in preset("full")["load_cases"]} == set(SPECS)


def test_a_guarded_combination_runs_to_be_refused_without_check_refusals():
    planned = _plan(["tp2"], ["tp_device_map", "tp_group_offload"])
    for name, item in planned.items():
        if "tp_" not in name:
            continue
        assert item.runs and item.expected_refusal is not None and item.expected_refusal.checked
        assert item.expected_refusal.seen_in(
            f"ValueError: {LOADS[name.rsplit('/', 1)[1]].guard.error} (and the rest of diffusers' text)")


def test_a_release_without_the_guard_runs_the_combination_and_judges_its_numbers(monkeypatch):
    monkeypatch.setattr(guard, "_source", lambda: "")
    item = _plan(["tp2"], ["tp_group_offload"])["flux/tp2/native/fp32/tensor/tp_group_offload"]
    assert item.runs and item.expected_refusal is None


def test_every_guard_is_read_from_the_installed_diffusers_source():
    guarded = [load for load in LOADS.values() if load.guard is not None]
    assert len(guarded) == 5 and all(load.guarded_here() is load.guard for load in guarded), \
        "a guard's text left 0.42.1"


def test_a_load_registered_twice_is_refused_naming_both_modules():
    from harness.loads import memory_load

    def enable(model, device):
        raise AssertionError("never registered, never called")

    with pytest.raises(ValueError, match="load 'enable' is registered twice: in harness.loads.documented and in "):
        memory_load("a second enable")(enable)
    assert LOADS[ENABLE].prepare is not enable


def test_each_guard_is_checked_where_diffusers_checks_it():
    """`from_pretrained` checks its options, `enable_parallelism` the model in memory: the reason names the call."""
    where = {name: load.refused_where for name, load in LOADS.items() if load.guard is not None}
    assert where == {"tp_device_map": "_check_tp_supported, from from_pretrained",
                     "tp_quantized": "_check_tp_supported, from from_pretrained",
                     "tp_group_offload": "_check_tp_supported, from enable_parallelism",
                     "tp_cpu_offload": "_check_tp_supported, from enable_parallelism",
                     "tp_lora": "_check_tp_supported, from enable_parallelism"}


def test_a_missing_package_is_a_skip_with_the_reason(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    item = _plan(["tp2"], ["tp_lora"])["flux/tp2/native/fp32/tensor/tp_lora"]
    assert item.skip_reason == "tp_lora needs peft (diffusers' LoRA layers), which is not installed"


def test_from_pretrained_cannot_take_helios_pruned_plan_so_it_is_a_skip():
    item = _plan(["ulysses2"], ["pretrained"], models=("helios",))["helios/ulysses2/native/fp32/tensor/pretrained"]
    assert "from_pretrained takes no cp_plan" in item.skip_reason


def test_a_known_issue_of_the_model_holds_for_its_pretrained_twin_and_loads_limits_an_entry():
    model_bug = KnownIssue("*/tp*/*/*/train", "model bug", error_contains="x")
    assert model_bug.applies("flux/tp2/native/fp32/train/pretrained", version="0.42.1")
    loader_bug = KnownIssue("*/ulysses*/*", "loader bug", error_contains="x", loads=("pretrained",))
    assert loader_bug.applies("flux/ulysses2/native/fp32/tensor/pretrained", version="0.42.1")
    assert not loader_bug.applies("flux/ulysses2/native/fp32/tensor", version="0.42.1")
    assert not loader_bug.applies("flux/ulysses2/native/fp32/tensor/pretrained_wrapped", version="0.42.1")


def test_the_crash_entry_names_its_first_release():
    from pathlib import Path

    from harness.run.known_issues import load_known_issues

    entry = next(issue for issue in load_known_issues(Path(__file__).resolve().parents[2] / "known_issues.toml")
                 if issue.loads == ("pretrained",))
    case = "flux/ring2/_native_flash/fp32/tensor/pretrained"
    assert entry.applies(case, "0.41.0") and entry.applies(case, "0.42.1") and not entry.applies(case, "0.40.0")
    assert not entry.applies("flux/tp2/native/fp32/tensor/pretrained", "0.42.1")


def _judged(load: dict | None):
    from harness.run.settings import load_settings
    from harness.run.verdict import judge

    case = Case("flux", parse_layout("tp2"), "native", "fp32", load="pretrained")
    metrics = {"max_abs_err": 1e-7, "mean_abs_err": 1e-8, "max_rel_err": 1e-6, "nonfinite": 0}
    record = CaseRecord(case.case_id, load=load, dispatched={"native": 2}, metrics=metrics)
    return judge(Outcome(case, record), load_settings({}))


def test_a_shard_that_differs_from_enables_is_a_fail_naming_the_parameter_and_the_rank():
    result = _judged({"call": "X.from_pretrained(...)", "params": 62, "note": None,
                      "differing": {"1": ["transformer_blocks.0.attn.to_q.weight"]}})
    assert result.status is Status.FAIL
    assert result.reason == ("rank 1: the local shard of transformer_blocks.0.attn.to_q.weight from from_pretrained "
                             "differs from enable_parallelism's on the same layout")
    assert result.evidence[0]["subject"] == "rank 1: transformer_blocks.0.attn.to_q.weight"
    clean = _judged({"call": "X.from_pretrained(...)", "params": 62, "note": None, "differing": {}})
    assert clean.status is Status.PASS
    rows = dict(map(tuple, clean.extra["blocks"][-1]["rows"]))
    assert rows["local shards vs enable_parallelism's"] == "equal, bit for bit, on every rank"


def test_repro_reads_the_load_from_a_case_id():
    from harness.versions.cases import parse_case_id, plan_options

    parts = parse_case_id("flux/tp2/native/fp32/tensor/pretrained")
    assert (parts["kind"], parts["load"], parts["mode"]) == ("tensor", "pretrained", "eager")
    assert parse_case_id("flux/tp2/native/fp32/tensor/compile")["load"] == ENABLE
    assert plan_options(["flux/tp2/native/fp32/tensor/pretrained"])["loads"] == "pretrained"


def test_a_guarded_combination_is_not_scripted():
    from harness.kinds import repro_template

    template, why = repro_template(Case("flux", parse_layout("tp2"), "native", "fp32", load="tp_lora"))
    assert template is None and "harness run --loads tp_lora" in why


# --- one real run: 2 ranks ------------------------------------------------------------------------------------------

RUN = [("ulysses2", "native", "pretrained", None), ("ulysses2", "native", "pretrained_wrapped", None),
       ("ulysses2", "native", "pretrained_wrapped", "load_cp_hooks_dropped"), ("tp2", "native", "pretrained", None),
       ("tp2", "native", "pretrained", "load_wrong_slice"), ("tp2", "native", "tp_device_map", None),
       ("tp2", "native", "tp_group_offload", None)]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, zoo_references):
    """The cases above in one launch of 2 ranks, judged with the project's known issues."""
    from pathlib import Path

    from harness.run import runner
    from harness.run.plan import PlannedCase, expected_refusal
    from harness.run.settings import load_settings

    folder = tmp_path_factory.mktemp("loads")
    (folder / "pyproject.toml").write_text("[tool.harness]\n")
    settings = load_settings({"references": str(zoo_references), "report_dir": str(folder / "reports"),
                              "known_issues": str(Path(__file__).resolve().parents[2] / "known_issues.toml"),
                              "keep_work": True}, start=folder)
    cases = [Case("flux", parse_layout(layout), backend, "fp32", load=load, fault=fault)
             for layout, backend, load, fault in RUN]
    plan = [PlannedCase(case, expected_refusal=expected_refusal(case)) for case in cases]
    lines: list[str] = []
    summary = runner.run(settings, plan, echo=lines.append, localize_failures=False, purpose="selftest")
    return {result.case_id: result for result in summary.results}, lines, folder / "reports"


@pytest.mark.slow
def test_the_checkpoint_is_saved_once_sharded_with_an_index(loaded):
    _, lines, reports = loaded
    assert sum(line.startswith("checkpoints: ") for line in lines) == 1
    folder = launches_folder(reports) / "checkpoints" / "flux" / "tensor"
    assert (folder / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 10


@pytest.mark.slow
def test_tensor_parallel_from_pretrained_passes_with_its_shards_proven_equal(loaded):
    result = loaded[0]["flux/tp2/native/fp32/tensor/pretrained"]
    assert result.status is Status.PASS, result.reason
    assert "parallel_config=TensorParallelConfig(tp_degree=2)" in result.extra["load"]["call"]
    assert result.extra["load"]["params"] == 62 and "differing" not in result.extra["load"]


@pytest.mark.slow
def test_context_parallel_from_pretrained_is_the_known_crash_and_its_wrapped_twin_passes(loaded):
    results = loaded[0]
    crashed = results["flux/ulysses2/native/fp32/tensor/pretrained"]
    assert crashed.status is Status.XFAIL and "has no attribute 'tensor_parallel_config'" in crashed.reason
    assert results["flux/ulysses2/native/fp32/tensor/pretrained_wrapped"].status is Status.PASS


@pytest.mark.slow
def test_the_loader_controls_fail_where_their_clean_twins_pass(loaded):
    results = loaded[0]
    wrong = results["flux/tp2/native/fp32/tensor/pretrained+load_wrong_slice"]
    assert wrong.status is Status.FAIL and "rank 0: the local shard of " in wrong.reason
    dropped = results["flux/ulysses2/native/fp32/tensor/pretrained_wrapped+load_cp_hooks_dropped"]
    # only the communication proof, one item per exchange it missed (each a subject a known issue could name)
    assert dropped.status is Status.FAIL and {item["check"] for item in dropped.evidence} == {"proof.comms"}
    assert "transformer_blocks.0.attn: 0 all_to_all" in dropped.reason  # the numbers pass: every rank ran it all


@pytest.mark.slow
def test_what_diffusers_guards_is_refused_with_its_own_error(loaded):
    for load in ("tp_device_map", "tp_group_offload"):
        result = loaded[0][f"flux/tp2/native/fp32/tensor/{load}"]
        assert result.status is Status.REFUSED and "expected refusal" in result.reason
        assert LOADS[load].guard.error in result.reason


def test_case_id_helper_takes_the_load():
    assert case_id("flux", "default", "tp2", "native", "fp32", "tensor", load="pretrained") == \
        "flux/tp2/native/fp32/tensor/pretrained"
    assert replace(Case("flux", parse_layout("tp2"), "native", "fp32"), load="pretrained").case_id.endswith(
        "/pretrained")


def test_a_pytest_failure_reruns_its_load_alone():
    from harness.core.results import CaseResult
    from harness.plugin import rerun_command

    result = CaseResult("flux/tp2/native/fp32/tensor/pretrained", "flux", "default", "tensor", "tp2", 2, "native",
                        "fp32", load="pretrained")
    assert rerun_command(result).endswith("--kinds tensor --loads pretrained --load-cases '*'")
    assert "--loads" not in rerun_command(replace(result, load=ENABLE))
