"""`harness run --coverage` without torchrun: which statements are measured (read from the source), the reason of
each one never executed, the ranks' data combined, the typed record, and its views (matrix.md's line, the page's
section, `harness ab`'s changes). The run itself, in real ranks, is tests/unit/test_coverage_run.py."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from harness.catalogue.coverage import reasons, scope
from harness.core.coverage import (
    CUDA_ONLY,
    NOT_IN_PLAN,
    REFUSED,
    UNKNOWN,
    CoverageReport,
    FunctionCoverage,
    Gap,
    ModuleCoverage,
    read,
)

SOURCE = textwrap.dedent('''\
    import torch

    LIMIT = 3


    def _helper(x):
        y = x + 1
        return y


    def _unrelated(x):
        return x * 2


    def dispatch(q, _parallel_config=None):
        q = q + 0
        if _parallel_config is None:
            out = q * 1
        else:
            if (
                q > 0
                and q < 100
            ):
                q = q - 0
            out = _helper(q)
        return out


    def refuse(ring_degree, cp_config=None):
        if cp_config is not None and ring_degree < 1:
            raise ValueError(f"`ring_degree` must be >= 1, got {ring_degree}.")
        return ring_degree


    class Ring:
        size = 2

        def forward(self, x):
            return _helper(x)

        def backward(self, g):
            return g


    def _enable_parallelism(model):
        model.on = True
        return model
    ''')


def lines_of(text: str, *needles: str) -> set[int]:
    return {number for number, line in enumerate(text.splitlines(), 1) if any(n in line for n in needles)}


def by_name(functions) -> dict[str, set[int]]:
    return {function.name: function.lines for function in functions}


def test_parallel_paths_are_read_from_the_source():
    """Only what runs with a parallel configuration: the `else` of `is None`, what it calls (wholly), what names a
    token, and a function whose name says it is parallel; never the single-device branch, an unrelated function,
    a `def` line, a class body or a module-level statement."""
    found = by_name(scope.measured(ast.parse(SOURCE), whole=False))
    assert found["dispatch"] == lines_of(SOURCE, "out = _helper(q)", "if (", "q = q - 0")
    assert found["_helper"] == lines_of(SOURCE, "y = x + 1", "return y")
    assert found["refuse"] == lines_of(SOURCE, "raise ValueError")
    assert found["_enable_parallelism"] == lines_of(SOURCE, "model.on = True", "return model")
    assert "_unrelated" not in found and "Ring.forward" not in found  # nothing parallel reaches them


def test_a_whole_module_is_every_function_body_and_nothing_at_import():
    found = by_name(scope.measured(ast.parse(SOURCE), whole=True))
    assert found["Ring.forward"] == lines_of(SOURCE, "return _helper(x)") - lines_of(SOURCE, "out = ")
    measured = set().union(*found.values())
    assert not measured & lines_of(SOURCE, "import torch", "LIMIT = 3", "def ", "class Ring", "size = 2")


def test_every_part_is_found_in_the_installed_diffusers():
    found = {module.key: module for module in scope.scopes()}
    assert set(found) == {"hooks/context_parallel.py", "hooks/tensor_parallel.py", "models/_modeling_parallel.py",
                          "models/attention_dispatch.py", "models/modeling_utils.py"}
    names = {key: {f.name for f in module.functions} for key, module in found.items()}
    assert {"remove_context_parallel", "PartitionAnythingSharder.shard_anything"} <= names["hooks/context_parallel.py"]
    assert {"_templated_context_parallel_attention", "TemplatedUlyssesAnythingAttention.forward",
            "_native_attention"} <= names["models/attention_dispatch.py"]
    assert "ModelMixin.enable_parallelism" in names["models/modeling_utils.py"]
    # what has nothing to do with parallelism stays out
    assert "_AttentionBackendRegistry.register" not in names["models/attention_dispatch.py"]
    assert "ModelMixin.enable_gradient_checkpointing" not in names["models/modeling_utils.py"]
    single = next(f for f in found["models/attention_dispatch.py"].functions if f.name == "_native_attention")
    source = found["models/attention_dispatch.py"].path.read_text().splitlines()
    assert all("scaled_dot_product_attention(" not in source[line - 1] for line in single.lines)


def test_a_module_this_diffusers_lacks_is_absent_not_an_error():
    (found,) = scope.scopes((scope.Part("diffusers.hooks.no_such_module", "nothing", True),))
    assert found.path is None and found.absent == "this diffusers has no diffusers.hooks.no_such_module"


def module_scope(key: str = "models/attention_dispatch.py") -> scope.ModuleScope:
    tree = ast.parse(SOURCE)
    return scope.ModuleScope(scope.PARTS[0], key, Path("x.py"), scope.measured(tree, whole=True), tree=tree)


def facts(*cases: dict) -> reasons.Facts:
    return reasons.Facts(cases=list(cases), axes=("model", "layout", "kind"))


def test_reasons_refusal_plan_axis_and_unknown():
    module = module_scope()
    raise_line = min(lines_of(SOURCE, "raise ValueError"))
    (gap,) = reasons.classify(module, "refuse", [raise_line], reasons.Facts())
    assert gap.category == REFUSED and "ValueError: \"`ring_degree` must be >= 1, got {...}.\"" in gap.why
    backward = lines_of(SOURCE, "return g")
    (gap,) = reasons.classify(module, "Ring.backward", sorted(backward), facts({"kind": "tensor"}))
    assert (gap.category, gap.why) == (NOT_IN_PLAN, "the kind `train` (a backward pass)")
    # the plan ran training and the line still never ran: the rule does not explain it
    (gap,) = reasons.classify(module, "Ring.backward", sorted(backward), facts({"kind": "train"}))
    assert gap.category == UNKNOWN and "(a backward pass) ran and did not reach it" in gap.why
    (gap,) = reasons.classify(module, "_unrelated", sorted(lines_of(SOURCE, "return x * 2")), reasons.Facts())
    assert gap.category == UNKNOWN


def test_an_axis_the_harness_lacks_is_named_as_such():
    module = module_scope("models/modeling_utils.py")
    (gap,) = reasons.classify(scope.ModuleScope(module.part, module.key, module.path, module.functions,
                                                tree=module.tree), "ModelMixin.from_pretrained", [7],
                              facts({"kind": "tensor"}))
    assert gap.category == NOT_IN_PLAN and gap.why.startswith("the load axis `pretrained`")
    assert gap.why.endswith("(no such axis in this harness yet)")


def test_a_rule_needs_every_axis_value_it_names_and_may_hold_only_an_ifs_branch():
    """A rule over two axes is run only by a case with both values; `inside` takes only the statements under an
    `if` that tests that name; a rule with no axis says what no case does."""
    module = module_scope()
    rules = (reasons.Reach("*:dispatch", "a masked ring", (("layout", "ring*"), ("model", "qwen*")), inside="q"),
             reasons.Reach("*:dispatch", "nothing does this"))
    out = sorted(lines_of(SOURCE, "out = q * 1", "out = _helper(q)"))  # under `if _parallel_config ...`, not `q`
    apart = facts({"layout": "ring2", "model": "flux"}, {"layout": "ulysses2", "model": "qwenimage"})
    assert {gap.why for gap in reasons.classify(module, "dispatch", out, apart, rules)} == {"nothing does this"}
    rules = (reasons.Reach("*:dispatch", "a masked ring", (("layout", "ring*"), ("model", "qwen*"))),)
    (gap,) = reasons.classify(module, "dispatch", out, apart, rules)
    assert (gap.category, gap.why) == (NOT_IN_PLAN, "a masked ring")
    (gap,) = reasons.classify(module, "dispatch", out, facts({"layout": "ring2", "model": "qwenimage"}), rules)
    assert gap.category == UNKNOWN


def test_cuda_only_when_every_backend_that_reaches_it_is_missing_here():
    module = module_scope()
    helper = sorted(lines_of(SOURCE, "y = x + 1"))
    reaching = {"flash": "dispatch"}  # the backend `flash` is the function `dispatch`, which calls _helper
    replaced = reasons.Facts(replaced={"models/attention_dispatch.py:_helper": "the harness's shim runs instead"})
    (gap,) = reasons.classify(module, "_helper", helper, replaced)
    assert (gap.category, gap.why) == (CUDA_ONLY, "the harness's shim runs instead")
    (gap,) = reasons.classify(module, "_helper", helper,
                              reasons.Facts(unavailable={"flash": "needs CUDA"}, backends=reaching))
    assert gap.category == CUDA_ONLY and "`flash`" in gap.why and "needs CUDA" in gap.why
    # a backend that runs here reaches it too: not CUDA-only
    (gap,) = reasons.classify(module, "_helper", helper, reasons.Facts(
        unavailable={"flash": "needs CUDA"}, backends={**reaching, "native": "Ring"}))
    assert gap.category != CUDA_ONLY


def test_the_ranks_data_are_combined_and_read_per_function(tmp_path, monkeypatch):
    """Two processes' data files (as two ranks write them) combine into one report: a statement either ran is
    executed, the others are gaps with reasons."""
    import coverage

    from harness.run import coverage as coverage_run

    source = tmp_path / "fake_dispatch.py"
    source.write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    tree = ast.parse(SOURCE)
    found = scope.ModuleScope(scope.PARTS[3], "models/attention_dispatch.py", source,
                              scope.measured(tree, whole=False), tree=tree)
    folder = tmp_path / "coverage"
    folder.mkdir()
    for call in ("dispatch(1, _parallel_config=object())", "refuse(2, cp_config=1)"):
        tracer = coverage.Coverage(data_file=str(folder / "rank"), data_suffix=True, include=[str(source)],
                                   config_file=False)
        tracer.start()
        namespace = {}
        exec(compile(SOURCE, str(source), "exec"), namespace)  # noqa: S102 - the synthetic module above
        eval(call, namespace)  # noqa: S307
        tracer.stop()
        tracer.save()
    report = coverage_run.report(coverage_run.Measure(folder, [found]), [], {"diffusers": "0.42.1"})
    assert report.processes == 2
    functions = {f.name: f for f in report.modules[0].functions}
    # a statement over several lines counts as executed whichever of its lines the tracer saw (`if (` is never one)
    assert set(functions["dispatch"].executed) == lines_of(SOURCE, "out = _helper(q)", "if (", "q = q - 0")
    assert set(functions["_helper"].executed) == lines_of(SOURCE, "y = x + 1", "return y")
    assert functions["refuse"].executed == [] and functions["refuse"].gaps[0].category == REFUSED
    assert report.modules[0].source.endswith("/v0.42.1/src/diffusers/models/attention_dispatch.py")
    assert report.note == ""
    resumed = coverage_run.report(coverage_run.Measure(folder, [found]), [], {"diffusers": "0.42.1"}, kept=2)
    assert resumed.note == "2 case(s) kept by --resume ran in the interrupted run: their statements are not counted"


def report_of(executed: list[int], name: str = "shard_anything", extra: bool = False) -> CoverageReport:
    functions = [FunctionCoverage(name, 10, 20, [11, 12, 13], executed,
                                  [Gap([line], UNKNOWN if line == 13 else NOT_IN_PLAN, "the layout `ulysses2any`")
                                   for line in (11, 12, 13) if line not in executed])]
    if extra:
        functions.append(FunctionCoverage("new_path", 30, 40, [31, 32], [], [Gap([31, 32], UNKNOWN, "nothing")]))
    return CoverageReport("0.42.1", [ModuleCoverage("hooks/context_parallel.py", "hooks", functions,
                                                    source="https://example.test/cp.py"),
                                     ModuleCoverage("hooks/tensor_parallel.py", "tp", absent="no such module")],
                          processes=3)


def _header(**given):
    """A run's header as every reader gets it (typed, as results.json is read back)."""
    from harness.core.header import RunHeader

    return RunHeader.from_dict(given)


def test_the_record_reads_back_whole_and_says_one_line():
    report = report_of([11])
    again = read(_header(coverage=report.to_dict()))
    assert again == report
    assert report.summary() == ("diffusers 0.42.1 parallel code: 1/3 statements executed (33.3 %); 2 never: 1 not in "
                                "this plan, 1 unknown")
    assert read(_header()) is None


def test_the_views_carry_the_summary_and_link_every_function_to_its_lines(tmp_path):
    from harness.report.coverage import coverage_section
    from harness.report.write import write_reports

    header = {"environment": {"torch": "2.13", "diffusers": "0.42.1", "device": "cpu"},
              "coverage": report_of([11]).to_dict()}
    section = coverage_section(_header(**header))
    assert 'href="https://example.test/cp.py#L10-L20"' in section and "L12: the layout `ulysses2any`" in section
    assert "no such module" in section and "33.3 %" in section
    assert coverage_section(_header()) == ""
    write_reports(tmp_path, [], _header(**header))
    assert "Coverage: diffusers 0.42.1 parallel code: 1/3" in (tmp_path / "matrix.md").read_text()
    assert 'id="coverage"' in (tmp_path / "index.html").read_text()
    write_reports(tmp_path, [], _header(environment=header["environment"]))
    assert "Coverage" not in (tmp_path / "matrix.md").read_text()


def test_ab_says_what_the_head_adds_that_the_plan_never_runs():
    from harness.versions.ab_coverage import compare

    base = _header(coverage=report_of([11, 12]).to_dict())
    head = _header(coverage=report_of([11], extra=True).to_dict())
    lines = compare(base, head).lines
    assert lines[0] == "coverage: base 2/3 (66.7 %), head 1/5 (20.0 %)"
    assert any(line.startswith("parallel code the plan never runs: hooks/context_parallel.py: new_path (new in the "
                               "head; 2 never executed") for line in lines), lines
    assert "executed less: hooks/context_parallel.py: shard_anything (2 -> 1 of 3)" in lines
    assert compare(head, head).lines == ["coverage: base 1/5 (20.0 %), head 1/5 (20.0 %)"]  # nothing new, nothing lost
    assert compare(_header(), head).lines == ["coverage: only the head measured it (run both sides with --coverage)"]
    assert compare(_header(), _header()).lines == []


@pytest.mark.parametrize("value", [True, False])
def test_the_option_reaches_the_settings(project, value):
    from harness.run.settings import load_settings

    (project / "pyproject.toml").write_text(f"[tool.harness]\ncoverage = {str(value).lower()}\n")
    assert load_settings(start=project).coverage is value
    assert load_settings({"coverage": not value}, start=project).coverage is (not value)
