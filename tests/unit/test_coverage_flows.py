"""The group of modules the flows touch under parallelism (LoRA/PEFT, the hooks, the processor and backend setters,
QKV fusion): declared beside the parallel modules, measured only when a run has flows, and shown as its own group.
A run without flows neither traces those files nor claims their lines (the negative control)."""

from __future__ import annotations

from harness.catalogue.coverage import scope
from harness.core.coverage import FLOWS, PARALLEL, CoverageReport, FunctionCoverage, Gap, ModuleCoverage
from harness.run import coverage as coverage_run


def test_a_run_without_flows_neither_traces_nor_reports_the_flows_modules(tmp_path):
    plain = coverage_run.prepare(True, tmp_path, flows=False)
    with_flows = coverage_run.prepare(True, tmp_path, flows=True)
    assert {found.part.group for found in plain.scopes} == {PARALLEL}
    assert not any("loaders/peft.py" in path or "hooks/hooks.py" in path for path in plain.files)
    touched = [found for found in with_flows.scopes if found.part.group == FLOWS]
    assert {"loaders/peft.py", "utils/peft_utils.py", "hooks/group_offloading.py", "hooks/layerwise_casting.py",
            "models/attention.py"} <= {found.key for found in touched}
    assert any(path.endswith("loaders/peft.py") for path in with_flows.files)


def test_the_flows_group_leaves_the_parallel_figures_as_they_were(tmp_path):
    plain = {found.key: found.lines for found in scope.scopes(scope.PARTS)}
    both = scope.scopes(scope.PARTS + scope.FLOW_PARTS)
    assert {found.key: found.lines for found in both if found.part.group == PARALLEL} == plain


def test_a_part_of_named_functions_measures_those_whole_and_nothing_else():
    attention = next(found for found in scope.scopes(scope.FLOW_PARTS) if found.key == "models/attention.py")
    names = {function.name for function in attention.functions}
    assert "AttentionMixin.set_attn_processor" in names and "AttentionModuleMixin.fuse_projections" in names
    assert names <= set(attention.part.functions)  # no feed-forward, no transformer block of the same file
    setter = next(function for function in attention.functions if function.name.endswith(".set_attn_processor"))
    assert len(setter.lines) > 5  # its whole body, not only the lines naming a parallel config


def _module(key: str, group: str, executed: list[int]) -> ModuleCoverage:
    missing = [line for line in (1, 2, 3, 4) if line not in executed]
    gaps = [Gap(missing, "unknown", "nothing explains it")] if missing else []
    return ModuleCoverage(key, key, [FunctionCoverage("f", 1, 4, [1, 2, 3, 4], executed, gaps)], group=group)


def test_each_group_has_its_own_line_and_table_on_the_page():
    from harness.core.header import RunHeader
    from harness.report.coverage import coverage_section

    report = CoverageReport("0.42.1", [_module("hooks/context_parallel.py", PARALLEL, [1, 2, 3]),
                                       _module("loaders/peft.py", FLOWS, [1])], processes=2)
    assert report.summary() == ("diffusers 0.42.1 parallel code: 3/4 statements executed (75.0 %); 1 never: "
                                "1 unknown; and diffusers 0.42.1 code the flows touch under parallelism: 1/4 "
                                "statements executed (25.0 %); 3 never: 3 unknown")
    assert CoverageReport.from_dict(report.to_dict()) == report
    section = coverage_section(RunHeader.from_dict({"coverage": report.to_dict()}))
    assert f'data-coverage-group="{PARALLEL}"' in section and f'data-coverage-group="{FLOWS}"' in section
    assert section.index("hooks/context_parallel.py") < section.index(FLOWS) < section.index("loaders/peft.py")
    alone = CoverageReport("0.42.1", report.modules[:1])
    assert FLOWS not in coverage_section(RunHeader.from_dict({"coverage": alone.to_dict()}))
    assert FLOWS not in alone.summary()


def test_ab_compares_a_file_measured_in_both_groups_group_by_group():
    """attention_dispatch.py is parallel code and holds the backend setters the flows call: each group's figure is
    compared with the same group's."""
    from harness.core.header import RunHeader
    from harness.versions.ab_coverage import compare

    def header(parallel_ran: list[int]) -> RunHeader:
        report = CoverageReport("0.42.1", [_module("models/attention_dispatch.py", PARALLEL, parallel_ran),
                                           _module("models/attention_dispatch.py", FLOWS, [1, 2])])
        return RunHeader.from_dict({"coverage": report.to_dict()})

    assert not any(line.startswith("models/attention_dispatch.py") for line in compare(header([1]), header([1])).lines)
    changed = [line for line in compare(header([1]), header([1, 2, 3])).lines
               if line.startswith("models/attention_dispatch.py")]
    assert changed == ["models/attention_dispatch.py: 1/4 -> 3/4 (75.0 %)"]
