"""benchmarks/results_diff.py, the check that the groundwork changed no verdict: a run against itself across the
field layouts is 0 differences, and a changed status, figure or evidence item is named."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("results_diff", ROOT / "benchmarks" / "results_diff.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BEFORE = [{"case_id": "m/ulysses2/native/bf16/train", "kind": "train", "status": "PASS", "reason": "",
           "max_abs_err": 0.0055, "grad_err": 0.0097, "seconds": 0.44, "evidence": [],
           "extra": {"vs_baseline": {"psnr": float("inf")}, "forward_s": 0.4}},
          {"case_id": "m/tp2/native/fp32/train", "kind": "train", "status": "XFAIL", "reason": "known issue: x",
           "max_abs_err": 1e-6, "grad_err": 2e-3, "seconds": 0.5,
           "evidence": [{"check": "ranks_agree", "subject": "a.weight", "text": "t", "known": "k"}], "extra": {}}]


def _after(before):
    after = []
    for case in before:
        figures = [{"name": "grad_err", "value": case["grad_err"]},
                   {"name": "weight_max_abs_err", "value": case["max_abs_err"]},
                   {"name": "seconds", "value": 9.9}]  # a timing: never compared
        if "vs_baseline" in case["extra"]:
            figures.append({"name": "vs_baseline_psnr", "value": "inf"})
        after.append({"case_id": case["case_id"], "kind": case["kind"], "status": case["status"],
                      "reason": case["reason"], "figures": figures, "evidence": case["evidence"], "extra": {}})
    return after


def test_the_same_run_in_both_layouts_has_no_difference(tmp_path):
    counted, differences = _script().compare(BEFORE, _after(BEFORE))
    assert differences == []
    assert counted["figures"] == 5 and counted["evidence items"] == 1


def test_a_changed_status_figure_or_evidence_is_named(tmp_path):
    after = _after(BEFORE)
    after[0]["figures"][0]["value"] = 0.02
    after[1]["status"] = "FAIL"
    after[1]["evidence"] = []
    _, differences = _script().compare(BEFORE, after)
    assert differences == ["m/tp2/native/fp32/train: status 'XFAIL' -> 'FAIL'",
                           "m/tp2/native/fp32/train: evidence differs",
                           "m/ulysses2/native/bf16/train: figure grad_err 0.0097 -> 0.02"]
    before, new = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps({"cases": BEFORE}))
    new.write_text(json.dumps({"cases": after}))
    assert _script().main([str(before), str(new)]) == 1


def test_two_runs_of_the_typed_layout_compare_figure_by_figure():
    """Found comparing two full plans of today: every figure was reported new, the typed figures of before unread."""
    run = _after(BEFORE)
    counted, differences = _script().compare(run, _after(BEFORE))
    assert differences == [] and counted["figures"] == 5
    changed = _after(BEFORE)
    changed[1]["figures"][1]["value"] = 2e-6
    assert _script().compare(run, changed)[1] == ["m/tp2/native/fp32/train: figure weight_max_abs_err 1e-06 -> 2e-06"]
