"""benchmarks/results_diff.py, the check that a change of the harness changed no verdict: a real run against itself
is 0 differences, and a changed status, figure, evidence item or a figure gone is named."""

import importlib.util
import json
from pathlib import Path

from harness.core.results import Status, read_results
from tests.records import REAL_RUN

ROOT = Path(__file__).resolve().parents[2]
TP2 = "flux/tp2/native/fp32/tensor"
TRAIN = "flux/ulysses2/native/bf16/train"


def _script():
    spec = importlib.util.spec_from_file_location("results_diff", ROOT / "benchmarks" / "results_diff.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run() -> dict:
    """The real run's cases by id, read afresh (each test changes its own copy)."""
    return {case.case_id: case for case in read_results(REAL_RUN)[1]}


def test_a_run_against_itself_has_no_difference():
    counted, differences = _script().compare(list(_run().values()), list(_run().values()))
    assert differences == []
    assert counted["cases"] == 8 and counted["figures"] == sum(len(case.figures) for case in _run().values())


def test_a_changed_status_figure_or_evidence_is_named():
    after = _run()
    after[TRAIN].figures[0]["value"] = 0.02
    after[TP2].status, after[TP2].evidence = Status.FAIL, [{"check": "max_abs_err", "text": "t"}]
    after[TP2].figures = [figure for figure in after[TP2].figures if figure["name"] != "mean_abs_err"]
    _, differences = _script().compare(list(_run().values()), list(after.values()))
    grad_err = _run()[TRAIN].figures[0]["value"]
    assert differences == [f"{TP2}: status 'PASS' -> 'FAIL'", f"{TP2}: figure mean_abs_err is gone",
                           f"{TP2}: evidence differs", f"{TRAIN}: figure grad_err {grad_err!r} -> 0.02"]


def test_the_command_reads_two_results_files_and_exits_1_on_a_difference(tmp_path, capsys):
    payload = json.loads(REAL_RUN.read_text())
    payload["cases"][0]["status"] = "FAIL"
    changed = tmp_path / "results.json"
    changed.write_text(json.dumps(payload))
    assert _script().main([str(REAL_RUN), str(REAL_RUN)]) == 0
    assert _script().main([str(REAL_RUN), str(changed)]) == 1
    assert "flux/single/native/fp32/tensor: status 'PASS' -> 'FAIL'" in capsys.readouterr().out
