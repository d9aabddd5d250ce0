"""Plan-time decisions: unknown names are rejected, what cannot run is SKIP with the reason."""

import pytest

from harness.core.errors import HarnessError
from harness.run.plan import build_plan


def _reasons(plan):
    return {p.case.case_id: p.skip_reason for p in plan}


def test_cp_incapable_backend_is_skipped_with_diffusers_reason():  # the quick plan; --check-refusals runs it
    reasons = _reasons(build_plan(["flux"], ["ulysses2", "tp2"], ["_native_math", "native"], ["fp32"]))
    reason = reasons["flux/ulysses2/_native_math/fp32/tensor"]
    assert "not register backend '_native_math' as context-parallel" in reason
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


def test_shape_variants_appear_in_case_ids():
    plan = build_plan(["qwenimage"], ["ulysses2"], ["native"], ["fp32"], shapes=["all"])
    ids = [p.case.case_id for p in plan]
    assert "qwenimage/ulysses2/native/fp32/tensor" in ids
    assert "qwenimage@txt7/ulysses2/native/fp32/tensor" in ids
    assert "qwenimage@masked/ulysses2/native/fp32/tensor" in ids


def test_unknown_shape_lists_the_valid_ones():
    with pytest.raises(HarnessError, match="unknown shape.*'txt9'.*txt7"):
        build_plan(["flux"], ["ulysses2"], ["native"], ["fp32"], shapes=["txt9"])


def test_class_with_a_plan_but_no_spec_is_a_skip_row(monkeypatch):
    from harness.catalogue.zoo import SPECS, discover
    from harness.run.plan import uncovered_rows

    discover._discover.cache_clear()
    monkeypatch.delitem(SPECS, "wan")
    try:
        rows = {p.case.case_id: p.skip_reason for p in uncovered_rows()}
    finally:
        discover._discover.cache_clear()
    assert "WanTransformer3DModel/-/-/-/tensor" in rows
    assert rows["WanTransformer3DModel/-/-/-/tensor"].startswith("not covered: WanTransformer3DModel")
    assert not any("Flux" in case_id for case_id in rows)


def test_full_plan_preset_covers_every_model_and_dtype(project):
    from harness.catalogue.zoo import SPECS
    from harness.run.settings import load_settings

    settings = load_settings({"plan": "full", "dtypes": "fp32"})
    assert settings.models == list(SPECS)
    assert settings.dtypes == ["fp32"]  # the command line still wins over the preset
    assert "tp2+ulysses2" in settings.layouts and "ulysses2any" in settings.layouts


def test_uneven_split_is_known_before_launch():
    """`ulysses3` on 16 image tokens and 4 heads: SKIP with both reasons, no launch spent on it."""
    plan = {p.case.case_id: p for p in build_plan(["flux", "wan"], ["ulysses3", "ring2", "ulysses2any"], ["native"],
                                                  ["fp32"], shapes=["default", "txt7"])}
    reason = plan["flux/ulysses3/native/fp32/tensor"].skip_reason
    assert "image tokens 16, text tokens 8 not divisible by the context-parallel degree 3" in reason
    assert "num_attention_heads 4 not divisible by the Ulysses degree 3" in reason
    assert "text tokens 7 not divisible by the context-parallel degree 2" in plan["flux@txt7/ring2/native/fp32/tensor"]\
        .skip_reason
    assert plan["flux@txt7/ulysses2any/native/fp32/tensor"].skip_reason is None  # ulysses_anything takes it
    assert plan["wan@txt7/ring2/native/fp32/tensor"].skip_reason is None  # Wan does not split its text


def test_check_refusals_runs_what_diffusers_should_refuse_with_the_expected_text():
    plan = {p.case.case_id: p for p in build_plan(["flux"], ["ulysses2", "ulysses3"], ["_native_math", "native"],
                                                  ["fp32"], check_refusals=True)}
    math = plan["flux/ulysses2/_native_math/fp32/tensor"]
    assert math.skip_reason is None
    assert math.expected_refusal.seen_in("ValueError: ... which does not support context parallelism. Please ...")
    uneven = plan["flux/ulysses3/native/fp32/tensor"].expected_refusal
    assert uneven.seen_in("Tensor size along dimension to be sharded must be divisible by mesh size")
    assert uneven.seen_in("RuntimeError: shape '[1, 5, 3, 1, 12]' is invalid for input of size 240")
    assert plan["flux/ulysses2/native/fp32/tensor"].expected_refusal is None


def test_expected_refusal_is_xfail_only_when_diffusers_refuses():
    from harness.catalogue.predictions import Refusal
    from harness.core.results import CaseResult, Status
    from harness.run.verdict import apply_expected_refusal

    refusal = Refusal("backend not context-parallel capable", ("does not support context parallelism",))

    def result(status, reason=""):
        return CaseResult("flux/ulysses2/flex/fp32/tensor", "flux", "default", "tensor", "ulysses2", 2, "flex",
                          "fp32", status, reason=reason)

    refused = apply_expected_refusal(result(Status.ERROR, "ValueError: ... does not support context parallelism."),
                                     refusal)
    assert refused.status is Status.REFUSED and refused.reason.startswith("expected refusal: backend not")
    other = apply_expected_refusal(result(Status.ERROR, "RuntimeError: something else"), refusal)
    assert other.status is Status.ERROR
    ran_wrong = apply_expected_refusal(result(Status.FAIL, "max abs err 0.03 > tolerance 1e-05"), refusal)
    assert ran_wrong.status is Status.FAIL  # runs where it should refuse, and is wrong: the bug class itself
    ran_right = apply_expected_refusal(result(Status.PASS), refusal)
    assert ran_right.status is Status.PASS and "although a refusal was expected" in ran_right.reason


def test_a_transformer_module_that_does_not_import_is_an_error_row(monkeypatch):
    from harness.catalogue.zoo import discover
    from harness.run.plan import uncovered_rows

    monkeypatch.setattr(discover, "import_failures",
                        lambda: [("diffusers.models.transformers.transformer_new", "ImportError: needs foo")])
    rows = {p.case.case_id: p for p in uncovered_rows()}
    row = rows["transformer_new/-/-/-/tensor"]
    assert not row.runs and row.skip_reason is None
    assert row.plan_error == "could not import diffusers.models.transformers.transformer_new: ImportError: needs foo"


def test_a_backend_that_runs_everywhere_but_fails_its_probe_is_an_error_not_a_skip(monkeypatch):
    """A diffusers regression that makes `native` raise must not turn its cases into SKIP (exit 0, pytest green)."""
    from harness.rank import backends
    from harness.run.verdict import not_run

    backends.probe.cache_clear()
    from diffusers.models import attention_dispatch

    def broken(*args, **kwargs):
        raise RuntimeError("native broke")

    monkeypatch.setattr(attention_dispatch, "dispatch_attention_fn", broken)
    try:
        plan = {p.case.case_id: p for p in build_plan(["flux"], ["tp2"], ["native", "_native_cudnn"], ["fp32"])}
    finally:
        backends.probe.cache_clear()
    native = plan["flux/tp2/native/fp32/tensor"]
    assert native.skip_reason is None and not native.runs
    assert native.plan_error.startswith("the native backend's probe failed (fp32, ")
    assert native.plan_error.endswith("): RuntimeError: native broke")
    assert not_run(native).status.value == "ERROR"
    assert plan["flux/tp2/_native_cudnn/fp32/tensor"].skip_reason.startswith("needs CUDA")  # unavailable: SKIP


def _status(plan, case_id):
    from harness.run.verdict import not_run

    return not_run(next(p for p in plan if p.case.case_id == case_id)).status.value


def test_a_combination_that_cannot_exist_is_not_applicable_and_what_could_run_elsewhere_is_skip(monkeypatch):
    """Each class of plan-time reason, as its code declares it: diffusers refusing the combination, a model without
    the plan a layout needs, a backend PyTorch's ring cannot go through are N/A; too many ranks, a backend this
    machine lacks, a class without a harness spec are SKIP (the negative controls: N/A is not every skip)."""
    import torch

    from harness.run import plan as plan_module

    plan = build_plan(["flux"], ["ulysses2", "tcp2"], ["_native_math", "native"], ["fp32"])
    assert _status(plan, "flux/ulysses2/_native_math/fp32/tensor") == "N/A"  # diffusers refuses the backend
    assert _status(plan, "flux/tcp2/_native_math/fp32/tensor") == "N/A"  # beside PyTorch's ring, not through it
    assert _status(build_plan(["flux"], ["ulysses4"], ["native"], ["fp32"], cpu_max_ranks=2),
                   "flux/ulysses4/native/fp32/tensor") == "SKIP"
    if not torch.cuda.is_available():
        assert _status(build_plan(["flux"], ["tp2"], ["_native_cudnn"], ["bf16"]),
                       "flux/tp2/_native_cudnn/bf16/tensor") == "SKIP"
    model_class = plan_module.get_spec("flux").model_class()
    monkeypatch.setattr(model_class, "_tp_plan", None)
    tp = build_plan(["flux"], ["tp2"], ["native"], ["fp32"])
    assert tp[0].skip_reason == "FluxTransformer2DModel defines no _tp_plan"
    assert _status(tp, "flux/tp2/native/fp32/tensor") == "N/A"


def test_with_check_refusals_a_refused_combination_runs_and_not_covered_classes_stay_skip(monkeypatch):
    checked = build_plan(["flux"], ["ulysses2"], ["_native_math"], ["fp32"], check_refusals=True)
    assert checked[0].runs and checked[0].expected_refusal is not None
    monkeypatch.setattr("harness.catalogue.zoo.discover.parallel_classes",
                        lambda: [{"class_name": "NewTransformer", "spec": None}])
    monkeypatch.setattr("harness.catalogue.zoo.discover.import_failures", lambda: [])
    from harness.run.plan import uncovered_rows

    rows = uncovered_rows()
    assert _status(rows, rows[0].case.case_id) == "SKIP"  # a harness spec could be written: it could run


def test_the_slices_take_ids_and_globs_alike_and_combine():
    """Each slice (compile, load, flow) names its cases by id or by glob: the same cases either way; a compiled mode
    of a load of a flow only where every slice takes it (the compile slice's ids keep the load and the flow); an id
    that names no case takes none."""
    more = {"mode": ["eager", "aot_eager"], "load": ["enable", "pretrained"], "flow": ["none", "lora"]}

    def ids(compile_cases, load_cases, flow_cases):
        return [planned.case.case_id for planned in build_plan(
            ["flux"], ["single", "ulysses2", "tp2"], ["native"], ["fp32"], more=more, compile_cases=compile_cases,
            load_cases=load_cases, flow_cases=flow_cases)]

    tp2 = "flux/tp2/native/fp32/tensor"
    by_id = ids([tp2], [tp2], [tp2])
    assert by_id == ids(["flux/tp?/native/fp32/tensor"], ["flux/tp2/native/fp32/tenso[r]"],
                        ["*/[t]p2/native/fp32/tensor"])
    assert {f"{tp2}/aot_eager", f"{tp2}/pretrained", f"{tp2}/lora"} <= set(by_id)
    assert f"{tp2}/lora/aot_eager" not in by_id
    assert f"{tp2}/lora/aot_eager" in ids(["*/tp2/*"], [tp2], [tp2])
    assert not any(case_id.count("/") > 4 for case_id in by_id if not case_id.startswith("flux/tp2/"))
    plain = ids(["flux/tp3/native/fp32/tensor"], ["nothing"], ["flux/tp2/native/fp32/train"])
    assert plain == [case_id for case_id in by_id if case_id.count("/") == 4]
