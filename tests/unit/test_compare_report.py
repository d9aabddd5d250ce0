"""`harness report --compare OLD NEW` as a CI gate: what counts as a regression, the summary line, the exit codes,
and a clear error for a folder without a readable results.json."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.header import RunHeader
from harness.core.results import CaseResult, Status, read_results, write_results
from harness.report import status_changes


def _result(case_id: str, status: str, reason: str = "") -> CaseResult:
    model, layout, backend, dtype, kind = case_id.split("/")
    return CaseResult(case_id, model, "default", kind, layout, 2, backend, dtype, Status(status), reason=reason)


def _run(folder: Path, cases: dict[str, str]) -> Path:
    results = [_result(case_id, status, f"{status.lower()} reason") for case_id, status in cases.items()]
    write_results(folder / "results.json", results,
                  RunHeader.from_dict({"environment": {"diffusers": "0.42.1"}, "started": "today"}))
    return folder


OLD = {
    "flux/ulysses2/native/fp32/tensor": "PASS",    # -> FAIL: regression
    "flux/ring2/native/fp32/tensor": "XFAIL",      # -> ERROR: regression
    "flux/ring4/native/fp32/tensor": "SKIP",       # -> TIMEOUT: regression
    "flux/tp2/native/fp32/tensor": "FAIL",         # -> PASS: a fix
    "flux/tp4/native/fp32/tensor": "FAIL",         # -> ERROR: failing before and after, no regression
    "flux/ulysses4/native/fp32/tensor": "PASS",    # -> XFAIL: not failing
    "flux/single/native/fp32/tensor": "PASS",      # unchanged
    "flux/ring2/flex/fp32/tensor": "FAIL",         # only in OLD
}
NEW = {
    "flux/ulysses2/native/fp32/tensor": "FAIL",
    "flux/ring2/native/fp32/tensor": "ERROR",
    "flux/ring4/native/fp32/tensor": "TIMEOUT",
    "flux/tp2/native/fp32/tensor": "PASS",
    "flux/tp4/native/fp32/tensor": "ERROR",
    "flux/ulysses4/native/fp32/tensor": "XFAIL",
    "flux/single/native/fp32/tensor": "PASS",
    "qwenimage/ulysses2/native/fp32/tensor": "PASS",   # only in NEW, passing
    "qwenimage/ring2/native/fp32/tensor": "ERROR",     # only in NEW, failing: flagged
}


def _cases(cases: dict[str, str]) -> list[CaseResult]:
    return [_result(case_id, status) for case_id, status in cases.items()]


def test_status_changes_separates_changed_from_one_sided():
    comparison = status_changes(_cases(OLD), _cases(NEW))
    assert [c["case_id"] for c in comparison.regressions] == list(NEW)[:3]
    assert [c["case_id"] for c in comparison.changed] == [*list(NEW)[:3], *list(NEW)[3:6]]  # regressions first
    assert [c["case_id"] for c in comparison.only_new] == list(NEW)[7:]
    assert [c["case_id"] for c in comparison.new_failing] == ["qwenimage/ring2/native/fp32/tensor"]
    assert comparison.only_old == [{"case_id": "flux/ring2/flex/fp32/tensor", "status": "FAIL", "reason": ""}]
    assert comparison.summary() == "6 changed status (3 regressions), 2 only in NEW (1 failing), 1 only in OLD"
    assert comparison.exit_code == 1


@pytest.mark.parametrize(("new", "code"), [
    ({"a/ring2/native/fp32/tensor": "PASS"}, 0),                       # nothing newly fails
    ({"a/ring2/native/fp32/tensor": "FAIL"}, 1),                       # PASS -> FAIL
    ({"a/ring2/native/fp32/tensor": "PASS", "b/x/native/fp32/tensor": "ERROR"}, 1),  # a new case that fails
    ({"b/x/native/fp32/tensor": "PASS"}, 0),                           # different plans, nothing failing
])
def test_exit_code_gates_on_anything_newly_failing(new, code):
    comparison = status_changes(_cases({"a/ring2/native/fp32/tensor": "PASS"}), _cases(new))
    assert comparison.exit_code == code


def test_cli_compare_prints_summary_and_exits_1_on_regression(tmp_path, capsys, monkeypatch):
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    old, new = _run(tmp_path / "old", OLD), _run(tmp_path / "new", NEW)
    assert main(["report", "--compare", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last == (f"compare: 6 changed status (3 regressions), 2 only in NEW (1 failing), 1 only in OLD; wrote "
                    f"{new / 'index.html'}, {new / 'compare.html'}; exit 1: a case newly fails")
    assert (new / "compare.html").is_file() and (new / "index.html").is_file()
    assert "| `flux/ulysses2/native/fp32/tensor` | PASS | FAIL \u26a0 | fail reason |" in out
    assert "| `qwenimage/ring2/native/fp32/tensor` | ERROR \u26a0 | error reason |" in out
    assert "Only in OLD: 1 (1 FAIL): `flux/ring2/flex/fp32/tensor`" in out
    assert "(absent)" not in out
    assert summary.read_text().startswith(f"## Status changes: {old} -> {new}\n\n**compare: 6 changed status")
    assert main(["report", "--compare", str(old), str(new)]) == 1  # NEW's page again, marking what changed
    assert capsys.readouterr().out.strip().endswith(f"wrote {new / 'index.html'}, {new / 'compare.html'}; exit 1: "
                                                    "a case newly fails")
    assert 'id="changes-line"' in (new / "index.html").read_text()


def test_cli_compare_of_different_plans_stays_short_and_exits_0(tmp_path, capsys):
    """A bigger NEW plan that passes: no row per added case, just the count and a few exact patterns."""
    layouts = ("single", "ulysses2", "ring2", "ulysses4", "ring4", "ring2xulysses2", "tp2", "tp4")
    new_cases = {f"{m}/{lay}/{b}/{d}/{k}": "PASS" for m in ("flux", "flux2", "qwenimage") for lay in layouts
                 for b in ("native", "_native_flash", "flex") for d in ("fp32", "bf16") for k in ("tensor", "image")}
    old_cases = {case_id: "PASS" for case_id in list(new_cases)[:8]}
    old, new = _run(tmp_path / "old", old_cases), _run(tmp_path / "new", new_cases)
    assert main(["report", "--compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 10, out
    assert f"compare: 0 changed status (0 regressions), {len(new_cases) - 8} only in NEW, 0 only in OLD; " in out
    assert "No case in both runs changed status." in out
    line = next(line for line in out.splitlines() if line.startswith("Only in NEW"))
    assert line.startswith(f"Only in NEW: {len(new_cases) - 8} ({len(new_cases) - 8} PASS): `") and len(line) < 800
    assert not out.strip().endswith("newly fails")


@pytest.mark.parametrize(("which", "content", "message"), [
    ("old", None, r"OLD run \(.*old\): no results at .*old/results\.json; run `harness run` first, or point at"),
    ("new", "{not json", r"NEW run \(.*new\): .*new/results\.json cannot be read as JSON \(.*\); run `harness run`"),
    ("new", "[1, 2]", r"NEW run \(.*new\): .*new/results\.json is not a harness results file"),
    ("old", '{"cases": [1]}', r"OLD run \(.*old\): .*old/results\.json is not a harness results file"),
])
def test_cli_compare_bad_results_is_a_clear_error(tmp_path, capsys, which, content, message):
    folders = {"old": tmp_path / "old", "new": tmp_path / "new"}
    _run(folders["old"], OLD), _run(folders["new"], NEW)
    target = folders[which] / "results.json"
    target.unlink()
    if content is not None:
        target.write_text(content)
    assert main(["report", "--compare", str(folders["old"]), str(folders["new"])]) == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.err) and captured.err.startswith("harness: error: "), captured.err
    assert "Traceback" not in captured.err
    assert not (folders["new"] / "compare.html").exists()  # nothing is written when either run is unreadable


def test_read_results_reads_what_write_results_writes(tmp_path):
    _run(tmp_path, {"a/ring2/native/fp32/tensor": "PASS"})
    header, cases = read_results(tmp_path / "results.json")
    assert header.started == "today" and cases[0].status is Status.PASS and cases[0].kernels == ""


def test_results_json_holds_each_case_on_a_line_of_its_own(tmp_path):
    """One JSON document whose cases are one line each (grep, diff); the empty run is valid JSON too."""
    import json

    _run(tmp_path, {f"a/ring{n}/native/fp32/tensor": "PASS" for n in (2, 4)})
    lines = (tmp_path / "results.json").read_text().splitlines()
    case_lines = [line for line in lines if '"case_id"' in line]
    assert len(case_lines) == 2 and all(json.loads(line.rstrip(","))["status"] == "PASS" for line in case_lines)
    assert len(read_results(tmp_path / "results.json")[1]) == 2
    _run(tmp_path, {})
    assert json.loads((tmp_path / "results.json").read_text())["cases"] == []


def test_tracebacks_are_stored_once_and_every_reader_resolves_them(tmp_path):
    """results.json writes each distinct traceback once (`tracebacks`) and an index in the case; read_results and
    CaseResult.from_dict with the table give the text back. Without the table the index is refused, not taken for a
    traceback (the control)."""
    import json

    shared, own = "Traceback (most recent call last):\n  ValueError: shared", "Traceback:\n  own"
    results = [_result(f"a/ring{n}/native/fp32/tensor", "XFAIL") for n in (2, 4, 8)]
    results.append(_result("b/ring2/native/fp32/tensor", "ERROR"))
    for result in results[:3]:
        result.extra["traceback"] = shared
    results[3].extra["traceback"] = own
    write_results(tmp_path / "results.json", results, RunHeader.from_dict({"started": "today"}))
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["tracebacks"] == [shared, own]
    assert [case["extra"]["traceback"] for case in payload["cases"]] == [0, 0, 0, 1]
    header, read = read_results(tmp_path / "results.json")
    assert header.started == "today" and [r.extra["traceback"] for r in read] == [shared] * 3 + [own]
    assert CaseResult.from_dict(payload["cases"][3], payload["tracebacks"]).extra["traceback"] == own
    with pytest.raises(ValueError, match="traceback #1 is not in the file's tracebacks table"):
        CaseResult.from_dict(payload["cases"][3])
