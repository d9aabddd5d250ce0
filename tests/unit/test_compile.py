"""The mode axis: compiled cases planned with their ids, graph breaks counted from the compiler, a
`--fullgraph` FAIL. The bugs traced into compiled graphs and caught while their clean twins pass are the selftest's
controls (tests/unit/test_negative_controls.py), run once in the session.

Compiling is what costs (docs/compile.md): the unit tests compile a toy module with `aot_eager`, the cheapest
backend; the one torchrun test compiles tiny Flux under ulysses2 with it too.
"""

from dataclasses import replace

import pytest
import torch

from harness.core.errors import HarnessError
from harness.core.layouts import parse_layout
from harness.core.modes import MODES
from harness.core.records import Case, CaseRecord, Outcome
from harness.core.results import Status
from harness.kinds.tensor import MAX_ABS
from harness.rank.compiled import CompiledRun
from harness.run.plan import build_plan
from harness.run.verdict import base_result, judge
from tests.judging import settings


def _plan(modes, kinds=("tensor",), layouts=("single", "ulysses2")):
    return build_plan(["flux"], list(layouts), ["native"], ["fp32"], kinds=kinds, more={"mode": list(modes)})


def test_eager_ids_stay_and_compiled_ids_name_their_mode():
    by_id = {planned.case.case_id: planned for planned in _plan(["eager", "compile", "aot_eager"])}
    assert set(by_id) == {f"flux/{layout}/native/fp32/tensor{suffix}" for layout in ("single", "ulysses2")
                          for suffix in ("", "/compile", "/aot_eager")}
    assert all(planned.runs for planned in by_id.values())
    case = by_id["flux/ulysses2/native/fp32/tensor/aot_eager"].case
    assert Case.from_dict(case.to_dict()) == case and base_result(case).mode == "aot_eager"


def test_a_failing_compiled_case_names_its_eager_twins_figure_or_says_it_is_absent():
    from harness.run.twins import name_eager_twins

    def result(case, status, error):
        found = base_result(case)
        found.status, found.reason = status, "max abs err > tolerance"
        found.figures = [MAX_ABS.of(error)]
        return found

    clean = Case("flux", parse_layout("ulysses2"), "native", "fp32", fault="compiled_only")
    eager = result(clean, Status.PASS, 1.8e-7)
    compiled = result(replace(clean, mode="compile"), Status.FAIL, 3.2e-2)
    alone = result(replace(clean, mode="aot_eager", fault=None), Status.FAIL, 3.2e-2)
    passing = result(replace(clean, mode="regional"), Status.PASS, 1e-7)
    name_eager_twins([eager, compiled, alone, passing])
    assert compiled.reason.endswith("; eager twin: PASS 1.8e-07 (compiled: FAIL 3.2e-02)"), compiled.reason
    assert compiled.extra["eager_twin"]["case_id"] == eager.case_id == "flux/ulysses2/native/fp32/tensor+compiled_only"
    assert alone.reason.endswith("eager twin flux/ulysses2/native/fp32/tensor: not in this run"), alone.reason
    assert "eager twin" not in passing.reason and "eager twin" not in eager.reason
    # merged with the shard that ran its twin (harness merge names them again): the absence is replaced, not kept
    twin = result(replace(clean, fault=None), Status.FAIL, 3.1e-2)
    name_eager_twins([alone, twin])
    assert alone.reason == "max abs err > tolerance; eager twin: FAIL 3.1e-02 (compiled: FAIL 3.2e-02)", alone.reason


def test_each_plan_compiles_its_slice_only_and_all_runs_every_mode_on_every_case():
    from harness.run.runner import plan_from
    from harness.run.settings import load_settings, preset

    quick = load_settings({}, start=settings().root)
    assert quick.modes == ["eager", "compile"] and quick.compile_cases == preset("quick")["compile_cases"]
    assert load_settings({"plan": "full"}, start=settings().root).modes == ["eager", "compile"]
    narrow = replace(quick, models=["flux"], layouts=["single", "ulysses2"], kinds=["tensor"], dtypes=["fp32"],
                     backends=["native"], shapes=["default", "txt7"])
    ids = {planned.case.case_id for planned in plan_from(narrow) if planned.case.mode != "eager"}
    from harness import flows  # the flows that declare `quick_compiled`, compiled on flux ulysses2 (a proof path each)

    compiled_flows = {f"flux/ulysses2/native/fp32/tensor/{value}/compile" for value in flows.quick_compiled()}
    assert compiled_flows and "flux/ulysses2/native/fp32/tensor/lora/compile" in compiled_flows
    assert ids == {"flux/single/native/fp32/tensor/compile", "flux/ulysses2/native/fp32/tensor/compile",
                   *compiled_flows}
    every = {planned.case.case_id for planned in plan_from(replace(narrow, modes=["all"]))}
    assert "flux@txt7/ulysses2/native/fp32/tensor/aot_eager" in every
    assert "flux@txt7/single/native/fp32/tensor/regional" in every


def test_an_unknown_mode_is_refused():
    with pytest.raises(HarnessError, match="unknown mode 'jit'"):
        _plan(["jit"])


def test_every_kind_and_regional_compilation_are_planned_and_a_model_without_repeated_blocks_is_a_skip():
    from harness.run.plan import mode_skip

    plan = _plan(["aot_eager", "regional"], kinds=("tensor", "train"), layouts=("ulysses2",))
    reasons = {planned.case.case_id: planned.skip_reason for planned in plan}
    for case_id in ("flux/ulysses2/native/fp32/tensor/aot_eager", "flux/ulysses2/native/fp32/train/aot_eager",
                    "flux/ulysses2/native/fp32/tensor/regional", "flux/ulysses2/native/fp32/train/regional"):
        assert reasons[case_id] is None
    case = Case("flux", parse_layout("single"), "native", "fp32", mode="regional")

    class Plain(torch.nn.Module):
        compile_repeated_blocks = None
        _repeated_blocks = ()

    assert "declares no _repeated_blocks" in mode_skip(case, Plain)
    assert "no compile_repeated_blocks" in mode_skip(case, torch.nn.Module)


def test_compiled_under_torch_context_parallelism_on_cpu_is_a_skip_with_its_reason():
    """Tried: the CPU shim's ring handler runs gloo collectives inside the traced graph and Dynamo stops with
    "Cannot access data pointer of Tensor", an ERROR of the harness's own making on CPU; it is said up front."""
    plan = _plan(["eager", "aot_eager"], kinds=("tensor",), layouts=("tcp2",))
    reasons = {planned.case.case_id: planned.skip_reason for planned in plan}
    assert reasons["flux/tcp2/native/fp32/tensor"] is None
    assert "Dynamo cannot trace" in reasons["flux/tcp2/native/fp32/tensor/aot_eager"]


def test_the_page_and_the_matrix_take_the_mode_from_its_declaration():
    from harness.report import axes

    assert "mode" in axes.names() and "mode" in axes.matrix()["column"]
    values = {"model": "flux", "shape": "default", "layout": "single", "backend": "native", "dtype": "fp32",
              "kind": "tensor"}
    assert axes.spell({**values, "mode": "compile"}) == "flux/single/native/fp32/tensor/compile"
    assert axes.spell({**values, "mode": "eager"}) == "flux/single/native/fp32/tensor"


def test_a_compiled_baseline_is_keyed_by_its_mode():
    from harness.engine.baselines import Baselines

    eager = Case("flux", parse_layout("single"), "native", "fp32")
    assert len(Baselines._key(eager, "native", None)) == 8  # eager keys (and files) as before the mode axis
    assert Baselines._key(replace(eager, mode="aot_eager"), "native", None)[-1] == "aot_eager"


def test_the_compile_cache_folder_travels_to_the_ranks_and_is_the_report_folders_own(tmp_path):
    from dataclasses import replace as changed

    from harness.core.records import GroupSpec
    from harness.run.runner import compile_cache

    group = GroupSpec("work", "references", None, [], compile_cache="/cache")
    assert GroupSpec.from_dict(group.to_dict()).compile_cache == "/cache"
    # Not given: the report folder's own, so two live runs (two report folders) never share a cache
    assert settings().compile_cache == ""
    ours, theirs = compile_cache(settings(), tmp_path / "reports"), compile_cache(settings(), tmp_path / "other")
    assert ours == str(tmp_path / "reports.work" / "compile-cache") and ours != theirs  # beside the artifact
    assert compile_cache(changed(settings(), compile_cache="/cache"), tmp_path / "reports") == "/cache"


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        q = self.proj(x).view(1, 2, 8, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q).reshape(1, 8, 8)


class _Toy(torch.nn.Module):
    def __init__(self, graph_break: bool):
        super().__init__()
        self.blocks, self.graph_break = torch.nn.ModuleList([_Attention(), _Attention()]), graph_break

    def forward(self, x):
        x = self.blocks[0](x)
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.blocks[1](x)


def _compiled_toy(graph_break: bool) -> CompiledRun:
    torch.manual_seed(0)
    toy, x = _Toy(graph_break), torch.randn(1, 8, 8)
    compiled = CompiledRun(MODES["aot_eager"])
    compiled.compile(toy)
    with torch.no_grad():
        eager = toy._call_impl(x)
        toy(x)  # the compile
        with compiled:
            output = toy(x)
    assert torch.equal(output, eager)
    return compiled


def _judged(compiled: CompiledRun, fullgraph: bool):
    case = Case("flux", parse_layout("single"), "native", "fp32", mode="aot_eager")
    metrics = {"max_abs_err": 0.0, "mean_abs_err": 0.0, "max_rel_err": 0.0, "nonfinite": 0}
    record = CaseRecord(case.case_id, seconds=0.1, dispatched={"native": 2}, metrics=metrics,
                        compiled=compiled.figures())
    run = replace(settings(), fullgraph=fullgraph)
    return judge(Outcome(case, record), run)


def test_the_graph_is_the_proof_its_kernels_counted_per_execution():
    compiled = _compiled_toy(graph_break=False)
    assert compiled.executed() == {"aten::_scaled_dot_product_flash_attention_for_cpu": 2}
    assert compiled.figures()["graph_breaks"] == 0 and compiled.figures()["recompiles"] == 0


def test_module_calls_are_counted_by_the_same_run_with_compilation_set_aside():
    """The prediction is scaled by each module's calls: one eager run under the eager recorder (force_eager), which
    compiles nothing new and leaves the graphs' counts alone."""
    from types import SimpleNamespace

    toy, x = _Toy(graph_break=False), torch.randn(1, 8, 8)
    compiled = CompiledRun(MODES["aot_eager"])
    compiled.compile(toy)

    def run_recorded(recorder):
        with recorder:
            return toy(x)

    with torch.no_grad():
        toy(x)
        compiled.count_calls(SimpleNamespace(module=toy, kernel_scope=None, run_recorded=run_recorded))
        with compiled:
            toy(x)
    assert compiled.calls["blocks.0"] == compiled.calls["blocks.1"] == 1
    assert compiled.figures()["graphs"] == 1 and compiled.figures()["executions"] == [1]


def test_sdpa_s_math_path_decomposed_in_the_graph_is_still_named():
    """AOTAutograd decomposes the math path into plain ops: the SDPA call Dynamo recorded without a fused kernel
    beneath it is the math kernel, as the eager recorder tells it; a fused kernel is never taken for math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from harness.rank import kernels

    class Math(torch.nn.Module):
        def forward(self, x):
            q = x.view(1, 2, 8, 4)
            with sdpa_kernel(SDPBackend.MATH):
                return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    toy, x = Math(), torch.randn(1, 8, 8)
    compiled = CompiledRun(MODES["aot_eager"])
    compiled.compile(toy)
    with torch.no_grad():
        toy(x)
        with compiled:
            toy(x)
    assert compiled.executed() == {kernels.MATH: 1}
    assert kernels.MATH not in _compiled_toy(graph_break=False).executed()


def test_a_graph_break_is_counted_and_fails_only_under_fullgraph():
    broken, clean = _compiled_toy(graph_break=True), _compiled_toy(graph_break=False)
    assert broken.figures()["graph_breaks"] == 1 and broken.figures()["graphs"] == 2
    assert "graph_break()" in next(iter(broken.figures()["break_reasons"]))
    assert broken.executed() == clean.executed()  # both graphs ran: the proof spans the break
    counted = _judged(broken, fullgraph=False)
    assert counted.status is Status.PASS and counted.figure("graph_breaks") == 1
    failed = _judged(broken, fullgraph=True)
    assert failed.status is Status.FAIL and "--fullgraph: 1 graph break(s)" in failed.reason
    assert _judged(clean, fullgraph=True).status is Status.PASS


def test_dispatches_inside_the_graph_count_per_execution_without_recompiling():
    """Under compile the count is an op of the graph (harness::dispatched): a count Dynamo could see would be
    guarded on, and every call of a multi-call run (an image case's denoising steps) would recompile."""
    from harness.rank import backends

    attention = backends._counted("native", torch.nn.functional.scaled_dot_product_attention)

    class Counted(torch.nn.Module):
        def forward(self, x):
            q = x.view(1, 2, 8, 4)
            return attention(q, q, q).reshape(1, 8, 8)

    toy, x = Counted(), torch.randn(1, 8, 8)
    compiled = CompiledRun(MODES["aot_eager"])
    compiled.compile(toy)
    with torch.no_grad():
        toy(x)
        toy(x)
        backends.reset_dispatches()
        with compiled:
            for _ in range(3):
                toy(x)
    assert backends.dispatches() == {"native": 3}
    assert compiled.figures()["graphs"] == 1 and compiled.figures()["recompiles"] == 0


def test_a_compiled_case_that_ran_no_compiled_graph_is_a_proof_failure():
    """A frame Dynamo skipped (or a fallback to eager) must never pass as compiled: the numbers are eager's."""
    toy, x = _Toy(graph_break=False), torch.randn(1, 8, 8)
    compiled = CompiledRun(MODES["aot_eager"])  # never handed the module: what a silent eager run looks like
    with torch.no_grad(), compiled:
        toy(x)
    result = _judged(compiled, fullgraph=False)
    assert result.status is Status.FAIL and "executed no compiled graph" in result.reason
    assert _judged(_compiled_toy(graph_break=False), fullgraph=False).status is Status.PASS


@pytest.mark.slow
def test_a_graph_break_in_diffusers_cp_attention_fails_under_fullgraph_with_the_numbers_right(settings_for, tmp_path):
    """aot_eager, flux ulysses2, `--fullgraph`: a graph break put into diffusers' CP attention is counted from the
    compiler and FAILs, its numbers still right. The compiled controls without a break (each rank attending only to
    its own chunk, SDPA wrong only while compiled, compiled training) and their clean twins are the selftest's
    (tests/unit/test_negative_controls.py)."""
    from harness.run import runner
    from harness.run.plan import PlannedCase

    case = Case("flux", parse_layout("ulysses2"), "native", "fp32", mode="aot_eager", fault="cp_graph_break")
    run = settings_for(report_dir=str(tmp_path / "reports"), fullgraph=True)
    (graph_break,) = runner.run(run, [PlannedCase(case)], echo=lambda _: None, localize_failures=False).results
    assert graph_break.status is Status.FAIL and "--fullgraph" in graph_break.reason, graph_break.reason
    assert graph_break.figure("graph_breaks") >= 1 and graph_break.figure("max_abs_err") < 1e-5


def test_each_execution_of_a_shared_graph_is_read_under_the_module_it_ran_in():
    """Regional compilation: both blocks run the graph of their class; each execution names its own block, so the
    attention kernels and calls are counted per block, not all at the first."""
    from harness.core.modes import Mode

    class Blocks(_Toy):
        _repeated_blocks = ("_Attention",)

        def compile_repeated_blocks(self, **kwargs):
            for block in self.blocks:
                block.compile(**kwargs)

    toy, x = Blocks(graph_break=False), torch.randn(1, 8, 8)
    compiled = CompiledRun(Mode("regional_aot_eager", "test", "aot_eager", regional=True))
    compiled.compile(toy)
    assert compiled.regions == ["blocks.0", "blocks.1"]
    with torch.no_grad():
        toy(x)
        with compiled:
            toy(x)
    ran_in = {name for graph in compiled.graphs for name in graph.runs}
    assert ran_in == {"blocks.0", "blocks.1"}
    assert compiled.executed() == {"aten::_scaled_dot_product_flash_attention_for_cpu": 2}


def test_regional_checks_the_exchanges_inside_the_blocks_and_names_those_it_cannot_see():
    from harness.rank.comms_check import Expectation

    compiled = CompiledRun(MODES["regional"])
    compiled.regions = ["transformer_blocks.0"]
    inside = Expectation("transformer_blocks.0.attn", "all_to_all", 4, "ulysses")
    outside = Expectation("proj_out", "all_gather", 1, "gather point")
    assert compiled.in_graphs([inside, outside]) == [inside]
    assert any("proj_out all_gather run(s) eager between the graphs" in note for note in compiled.notes())
    whole = CompiledRun(MODES["compile"])
    assert whole.in_graphs([inside, outside]) == [inside, outside] and len(whole.notes()) == 2


def test_a_hooked_module_s_path_in_the_graph_is_its_name_in_the_model():
    """diffusers' hooks wrap forward; Dynamo writes the path through the wrapper's closure."""
    from harness.rank.compiled import _module

    hooked = ("L['self'].transformer_blocks[0].forward.func.__closure__[0].cell_contents.forward.func.__closure__[0]"
              ".cell_contents.forward.__self__.attn")
    assert _module(hooked) == "transformer_blocks.0.attn"
    assert _module("forward.__self__.__dict__['_modules']['blocks'].0.attn") == "blocks.0.attn"


@pytest.mark.slow
def test_inductor_compiles_the_toy_and_its_graph_still_proves_the_attention():
    """The one Inductor test (it generates and builds C++: tens of seconds here): the same numbers as eager within
    fusion noise, and the attention op read from the post-grad graph Inductor compiled."""
    torch.manual_seed(0)
    toy, x = _Toy(graph_break=False), torch.randn(1, 8, 8)
    compiled = CompiledRun(MODES["compile"])
    compiled.compile(toy)
    with torch.no_grad():
        eager = toy._call_impl(x)
        toy(x)
        with compiled:
            output = toy(x)
    assert torch.allclose(output, eager, atol=1e-5)
    assert sum(compiled.executed().values()) == 2 and compiled.figures()["graphs"] == 1
    assert any("Inductor" in note for note in compiled.figures()["notes"])


def test_inductor_s_cpu_kernels_are_scalar_in_a_cpu_rank_unless_the_user_asks(monkeypatch):
    """The CPU shim: Inductor's C++ kernels stand in for GPU ones, and vectorized ones cost a quarter of a cold
    compile; a TORCHINDUCTOR_VEC_ISA_OK the user set is theirs."""
    from torch._inductor import config, cpu_vec_isa

    from harness.rank import cpu

    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    monkeypatch.setattr(config.cpp, "vec_isa_ok", None)
    try:
        cpu._inductor_kernels_scalar()
        assert config.cpp.vec_isa_ok is False and not cpu_vec_isa.pick_vec_isa()  # no ISA: scalar loops
        monkeypatch.setattr(config.cpp, "vec_isa_ok", None)
        monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", "1")
        cpu._inductor_kernels_scalar()
        assert config.cpp.vec_isa_ok is None  # left as Inductor read the variable
    finally:
        cpu_vec_isa.valid_vec_isa_list.cache_clear()  # probed again, as Inductor would, by the next compile


def test_a_rank_that_said_done_may_exit_while_rank_0_still_judges(tmp_path):
    """The last case of a launch: rank 1 is done and gone while rank 0 compiles the baseline; a rank gone without
    saying so is still a death."""
    import os
    import subprocess
    import sys

    from harness.core.events import Done, Hello, Start
    from harness.run.launch import _Watch

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started = (Hello(0, 0.0, os.getpid()), Hello(1, 0.0, gone.pid), Start(0, 0.0, "case"))
    for events, dead in ((started, [1]), ((*started, Done(1, 0.0)), [])):
        watch = _Watch(tmp_path, 2)
        for event in events:
            watch._on(event)
        assert watch.dead_ranks() == dead
    # seen gone before its "done" line was read (under load, rank 0 judging the last case of the selftest's 4-rank
    # launch): once the line is read, no death
    watch = _Watch(tmp_path, 2)
    for event in started:
        watch._on(event)
    assert watch.dead_ranks() == [1]
    watch._on(Done(1, 0.0))
    assert watch.dead_ranks() == []
