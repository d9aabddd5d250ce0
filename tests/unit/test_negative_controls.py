"""Negative controls with real torchrun processes: every deliberate bug must come out FAIL.

All controls share one launch per world size (the selftest plan), so this module costs ~10 s.
"""

from pathlib import Path

import pytest

from harness.core.figures import limit
from harness.core.results import Status
from harness.report.matrix import WIDTH
from harness.run import flow_controls
from harness.run.selftest import CONTROLS

pytestmark = pytest.mark.slow
KNOWN_ISSUES = Path(__file__).resolve().parents[2] / "known_issues.toml"
# The generated flow controls of a flow of each way to catch one (`harness selftest` runs every flow's): the numbers
# (a LoRA; an unload left out), what the calls changed of each rank's model (a processor, the backend, an offload), and
# the ranks' diverging collectives (a cache)
FLOWS = ["lora", "lora_unload_after", "processor", "backend_after", "group_offload_after", "cache_pab"]


@pytest.fixture(scope="module")
def control_results(tmp_path_factory, zoo_references):
    """`harness selftest` as it runs: its table, and the results it wrote."""
    from harness.core.results import read_results
    from harness.run.selftest import selftest
    from harness.run.settings import load_settings

    folder = tmp_path_factory.mktemp("selftest")
    (folder / "pyproject.toml").write_text("[tool.harness]\n")
    # The project's known issues: a control whose clean twin is a known issue must not hide behind it.
    settings = load_settings({"references": str(zoo_references), "report_dir": str(folder / "reports"),
                              "known_issues": str(KNOWN_ISSUES)}, start=folder)
    lines: list[str] = []
    code = selftest(settings, echo=lines.append, flow_values=FLOWS)
    header, cases = read_results(folder / "reports/results.json")
    return {case.case_id: case for case in cases}, header.to_dict(), code, lines


def test_the_selftest_says_each_control_in_one_short_line(control_results):
    _, header, code, lines = control_results
    assert code == 0, "\n".join(lines)
    rows = [line for line in lines if line.startswith(("  caught", "  MISSED"))]
    generated = flow_controls.generate(FLOWS)
    assert len(rows) == len(CONTROLS) + 1 + len(generated) and all(row.startswith("  caught") for row in rows)
    assert all(len(line) <= WIDTH for line in lines) and len(lines) < len(CONTROLS) + len(generated) + 20
    assert not any(line.startswith("[") for line in lines)  # no per-case progress, no matrix
    assert header["purpose"] == "selftest"


@pytest.mark.parametrize("control", CONTROLS, ids=[c.name for c in CONTROLS])
def test_deliberate_bug_fails_and_clean_twin_passes(control_results, control):
    results = control_results[0]
    assert results[control.clean_id].status is control.clean, results[control.clean_id].reason
    faulty = results[control.name]
    assert faulty.status is Status.FAIL, faulty.reason
    assert control.expected in faulty.reason
    if control.eager is not None:  # the fault run eager: a compiled-only bug PASSes there
        assert results[control.eager_id].status is control.eager, results[control.eager_id].reason
    tolerance = limit(faulty.figures, "max_abs_err")
    if control.expected == "> tolerance" and control.dtype == "fp32":
        assert faulty.figure("max_abs_err") > 100 * tolerance
    if control.expected == "error budget":  # the fixed bf16 tolerance alone would have passed it
        assert faulty.figure("max_abs_err") < tolerance
    if control.fault == "rope_sign":  # a change to the model itself: the layout agrees with its own baseline
        assert faulty.figure("vs_baseline_max_abs") < tolerance
    if control.kind == "image":  # the report's difference image shows it
        diff = faulty.extra["blocks"][0]["images"]["diff"]
        assert diff.endswith("-diff.png")


def test_every_flow_has_a_generated_control_and_each_way_to_catch_one_is_shown(control_results):
    """Every flow value gets a control leaving out all its calls, and one leaving out its last where it makes
    several; in the sample, each is caught the way its calls declare."""
    values = {control.value for control in flow_controls.generate()}
    from harness import flows

    assert values == set(flows.VALUES) - {flows.NONE}
    lasts = {control.value for control in flow_controls.generate() if control.fault == flow_controls.LAST}
    assert lasts == {name for name, value in flows.VALUES.items() if value.flow and len(value.flow.calls) > 1}
    results, lines = control_results[0], control_results[3]
    shown = {line.split()[1] + " " + line.split()[2]: line for line in lines if "(all calls)" in line
             or "(last call)" in line}
    assert "flow_calls, max_abs_err" in shown["lora (all"]
    assert "max_abs_err" in shown["lora_unload_after (last"] and "flow_calls" in shown["processor (all"]
    assert "flow_calls" in shown["group_offload_after (all"] and "flow_calls" in shown["backend_after (all"]
    pab = next(c for c in flow_controls.generate(["cache_pab"]))
    assert results[pab.case.case_id].status in (Status.TIMEOUT, Status.ERROR)  # the ranks' collectives diverged


def test_compiled_controls_are_proven_from_the_graphs_and_name_their_eager_twin(control_results):
    """aot_eager, flux ulysses2: the clean twins' exchanges are proven from the compiled graphs (training's CP
    attention backward breaks the graph: counted, not failed); a bug only the compiler's output has names its eager
    twin's PASS in its reason."""
    from harness.core.records import case_id

    results = control_results[0]
    tensor, train = (results[case_id("flux", "default", "ulysses2", "native", "fp32", kind, mode="aot_eager")]
                     for kind in ("tensor", "train"))
    assert tensor.status is Status.PASS and train.status is Status.PASS, (tensor.reason, train.reason)
    assert tensor.figure("graph_breaks") == 0 and tensor.figure("recompiles") == 0
    assert all(row["expected"] for row in tensor.extra["comms"])  # every exchange predicted, from the graphs
    assert train.figure("graph_breaks") >= 1
    assert all(row["expected"] for row in train.extra["comms"] if row["modules"] != "(model)")
    control = next(c for c in CONTROLS if c.fault == "compiled_only")
    compiled, eager = results[control.name], results[control.eager_id]
    assert f"eager twin: PASS {eager.cell} (compiled: FAIL {compiled.cell})" in compiled.reason, compiled.reason


def test_a_compiled_only_control_is_missed_when_its_fault_shows_eager_too():
    """The eager run of a compiled-only fault is part of the control: were the bug in eager too, the compiled case
    would not be what caught it."""
    from types import SimpleNamespace

    from harness.run.selftest import caught

    control = next(c for c in CONTROLS if c.eager is not None)
    by_id = {control.clean_id: SimpleNamespace(status=Status.PASS, reason=""),
             control.name: SimpleNamespace(status=Status.FAIL, reason=f"max abs err {control.expected} (0.03)")}
    for eager, found in ((Status.PASS, True), (Status.FAIL, False)):
        by_id[control.eager_id] = SimpleNamespace(status=eager, reason="")
        assert caught(control, by_id) is found


def test_controls_ran_in_one_launch_per_world_size(control_results):
    """One launch per world size, but for the cases a rank died in (a cache left out on one rank desynchronises the
    collectives: gloo aborts it): each such death ends its launch and the case runs once more in a fresh one, whose
    second death ends that launch too."""
    results, header, _, _ = control_results
    died = [result for result in results.values() if result.rank_death]
    assert len(header["world_sizes"]) == 3  # 1, 2 and 4 ranks
    assert 3 <= header["launches"] <= 3 + 2 * len(died), [result.case_id for result in died]


def test_localization_names_the_one_broken_module(tmp_path_factory, zoo_references):
    """`harness selftest --localize`: a bug in exactly one module (a scaled output, attention on the local chunk, a
    skipped all-reduce) over flux, flux2, qwenimage and wan, context and tensor parallel: the first divergence is
    that module in all but at most one, and the clean twins localize to nothing."""
    from harness.run.selftest import LOCALIZE_CONTROLS, localize_selftest
    from harness.run.settings import load_settings

    folder = tmp_path_factory.mktemp("localize")
    (folder / "pyproject.toml").write_text("[tool.harness]\n")
    settings = load_settings({"references": str(zoo_references), "report_dir": str(folder / "reports")}, start=folder)
    lines = []
    assert localize_selftest(settings, echo=lines.append) == 0, "\n".join(lines[-30:])
    assert len(LOCALIZE_CONTROLS) >= 20 and len({b.model for b in LOCALIZE_CONTROLS}) >= 3
    assert {b.layout.startswith("tp") for b in LOCALIZE_CONTROLS} == {True, False}
