"""The text views of a quick-plan-sized run: the terminal fits 120 columns, matrix.md stays a short CI summary that
still names every failing case, and the brace patterns that summarise case ids are exact."""

from __future__ import annotations

import itertools
import json
import re

import pandas as pd

from harness.core.figures import FigureSpec
from harness.core.results import CaseResult, Status
from harness.report import matrix
from harness.report.idsets import compact, describe

MODELS = ("flux", "flux2", "qwenimage")
LAYOUTS = ("single", "ulysses2", "ring2", "ulysses4", "ring4", "ring2xulysses2", "tp2", "tp4")
BACKENDS = ("native", "_native_math", "_native_flash", "flex")
LSE = "known issue: native attention has no log-sum-exp (https://github.com/huggingface/diffusers/issues/1)"
FAILING = {
    "flux/ring2/_native_flash/fp32/tensor": (Status.FAIL, "max_abs_err 1.2e-02 > tolerance 1e-05"),
    "qwenimage/ulysses4/flex/bf16/image": (Status.ERROR, "rank 1: RuntimeError: " + "shape mismatch " * 30),
    "flux2/tp4/native/fp32/tensor": (Status.TIMEOUT, "no result after 120 s; the group was killed"),
}


MAX_ABS = FigureSpec("max_abs_err", "max abs err", cell="{value:.1e}")
SSIM = FigureSpec("ssim", "SSIM", ".6f", cell="ssim {value:.4f}")
MEAN = FigureSpec("mean_abs_err", "mean abs err")


def _figures(kind: str, dtype: str) -> list[dict]:
    error = MAX_ABS.of(4.8e-07 if dtype == "fp32" else 7.7e-03, 1e-05)
    return [SSIM.of(0.99987, 0.9999), error] if kind == "image" else [error, MEAN.of(1e-8)]


def _result(model, layout, backend, dtype, kind) -> CaseResult:
    case_id = f"{model}/{layout}/{backend}/{dtype}/{kind}"
    world = 1 if layout == "single" else int(re.findall(r"\d+", layout)[0]) * (2 if "x" in layout else 1)
    result = CaseResult(case_id, model, "default", kind, layout, world, backend, dtype, Status.PASS,
                        figures=_figures(kind, dtype), dispatched=f"{backend}:2")
    if backend == "_native_math" and layout != "single":
        result.status = Status.NOT_APPLICABLE
        result.reason = "diffusers does not register backend '_native_math' as CP capable"
        result.figures = []
    elif layout.startswith("ring") and backend == "native":
        result.status = Status.XFAIL
        result.reason = f"{LSE}; observed rank {world - 1}: ValueError: Native attention does not support return_lse"
    elif case_id in FAILING:
        result.status, result.reason = FAILING[case_id]
    return result


def quick_plan() -> list[CaseResult]:
    """384 cases shaped like the quick plan (the CP-incapable backend N/A), plus the SKIP rows of classes without a
    harness spec."""
    results = [_result(*combo) for combo in itertools.product(MODELS, LAYOUTS, BACKENDS, ("fp32", "bf16"),
                                                              ("tensor", "image"))]
    for name in ("HunyuanVideo15Transformer3DModel", "SkyReelsV2Transformer3DModel"):
        results.append(CaseResult(f"{name}/-/-/-/tensor", name, "default", "tensor", "-", 1, "-", "-", Status.SKIP,
                                  reason=f"not covered: {name} has a parallel plan; no harness spec yet"))
    return results


def test_quick_plan_fixture_is_realistic():
    results = quick_plan()
    assert len(results) == 386
    assert matrix.counts(results) == {"PASS": 261, "FAIL": 1, "ERROR": 1, "SKIP": 2, "TIMEOUT": 1, "XFAIL": 36,
                                      "REFUSED": 0, "XPASS": 0, "N/A": 84}
    assert matrix.counts_line(results) == "261 PASS, 1 FAIL, 1 ERROR, 2 SKIP, 1 TIMEOUT, 36 XFAIL, 84 N/A"


def test_terminal_fits_120_columns_and_shows_every_case():
    results = quick_plan()
    text = matrix.terminal(results)
    too_wide = [line for line in text.splitlines() if len(line) > 120]
    assert not too_wide, too_wide[:3]
    for model in MODELS:  # one block per model, titled with that model's counts (SKIP and N/A included)
        tally = matrix.counts_line([r for r in results if r.model == model])
        assert f"\n{model}: {tally}\n" in "\n" + text
    for result in results:  # every case that ran has its cell in its model's block, row and column
        if result.status.ran:
            assert _cell_text(text, result) == matrix._cell(result), result.case_id
    failing = [line for line in text.splitlines() if line.startswith("  ") and line.split()[0] in ("FAIL", "ERROR",
                                                                                                 "TIMEOUT")]
    assert sorted(line.split()[1] for line in failing) == sorted(FAILING)
    *_, counts, stands = text.splitlines()  # the counts, then what the verdict stands on
    assert counts == matrix.counts_line(results)
    assert stands == "FAIL stands on: 3 new failures; 36 known crashes"


def _cell_text(text: str, result: CaseResult) -> str:
    """Read one cell back from the terminal grid by its block, row label and column header position."""
    block = ("\n" + text).split(f"\n{result.model}: ", 1)[1].split("\n\n", 1)[0].splitlines()
    header = block[1]
    column = matrix._column(result)
    start = re.search(rf"(?<=  ){re.escape(column)}(?=  |$)", header).start()
    row = next(line for line in block[2:] if line.split("  ", 1)[0] == f"{result.layout}/{result.backend}")
    return row[start:].split("  ", 1)[0].strip()


def test_terminal_wraps_columns_and_caps_long_names():
    results = [
        CaseResult(f"m/{'tp2+ulysses2' * 4}/{backend}/{dtype}/tensor", "m", shape, "tensor", "tp2+ulysses2" * 4, 4,
                   backend, dtype, Status.PASS, figures=[MAX_ABS.of(1e-7)])
        for backend in ("native", "_native_efficient" * 3)
        for shape in ("default", "txt7", "odd", "wide", "tall")
        for dtype in ("fp32", "bf16", "fp16")
    ]
    text = matrix.terminal(results)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "(columns 1 of " in text and "(columns 2 of " in text  # 15 columns do not fit side by side


def test_markdown_is_short_and_lists_every_failing_case():
    results = quick_plan()
    text = matrix.markdown(results, ["diffusers 0.42.1, torch 2.13.0+cpu, cpu", ""])
    lines = text.splitlines()
    assert len(lines) <= 45, text  # a CI step summary, not 386 rows; the full grid is index.html's
    assert max(len(line.split("|")) - 2 for line in lines if line.startswith("|")) <= 9  # columns per table row
    assert "**261 PASS, 1 FAIL, 1 ERROR, 2 SKIP, 1 TIMEOUT, 36 XFAIL, 84 N/A**" in text
    assert "| flux | 128 | 87 | **1** | 0 | 0 | 0 | 12 | 28 |" in text  # one row per model, a column per status
    for case_id, (status, _reason) in FAILING.items():  # nothing failing is hidden
        assert re.search(rf"^\| `{re.escape(case_id)}` \| \*\*{status.value}\*\* \| ", text, re.M), case_id
    xfail = [line for line in lines if LSE.split(" (")[0] in line]
    assert len(xfail) == 1 and xfail[0].startswith("| 36 | ")  # the 36 XFAIL cases: one row with their count
    assert xfail[0].endswith("| `{flux,flux2,qwenimage}/{ring2,ring4,ring2xulysses2}/native/{fp32,bf16}/{tensor,image}`"
                             " (36) |")
    not_applicable = text.split("### Not applicable", 1)[1]  # in its own table, not with the SKIP rows
    assert "| 84 | diffusers does not register backend '_native_math' as CP capable |" in not_applicable
    assert "| 1 | not covered: HunyuanVideo15Transformer3DModel" in text.split("### Skipped, by reason (2)", 1)[1]
    assert "`index.html`" in text and "matrix.csv" in text


def test_markdown_escapes_pipes_and_cuts_long_reasons():
    result = CaseResult("a/ring2/native/fp32/tensor", "a", "default", "tensor", "ring2", 2, "native", "fp32",
                        Status.ERROR, reason="x | y\n" + "z" * 1000)
    line = next(line for line in matrix.markdown([result]).splitlines() if line.startswith("| `a/"))
    assert "x \\| y z" in line and len(line) < 400


def test_csv_has_a_column_per_figure(tmp_path):
    """The result's own columns around one column per figure name, in the order the kinds declare them (first
    seen first); a case without a figure leaves its cell empty; the leading and trailing columns are CaseResult's
    fields, not a list of their own."""
    from dataclasses import fields

    results = quick_plan()
    matrix.write_csv(results, tmp_path / "matrix.csv")
    frame = pd.read_csv(tmp_path / "matrix.csv")
    assert list(frame.columns) == matrix.csv_columns(results) and len(frame) == len(results)
    figures = ["max_abs_err", "mean_abs_err", "ssim"]
    assert list(frame.columns)[len(matrix.LEADING):-len(matrix.TRAILING)] == [*matrix.DECIDING, *figures]
    assert set(matrix.LEADING + matrix.TRAILING) <= {f.name for f in fields(CaseResult)} | {"severity"}  # a property
    assert isinstance(CaseResult.severity, property)
    row = frame.set_index("case_id").loc["flux/ring2/_native_flash/fp32/image"]
    assert row["ssim"] == 0.99987 and row["max_abs_err"] == 4.8e-07 and pd.isna(row["mean_abs_err"])
    assert "kernels" in frame.columns


def _expand(pattern: str) -> set[str]:
    parts = [part[1:-1].split(",") if part.startswith("{") else [part] for part in pattern.split("/")]
    return {"/".join(combo) for combo in itertools.product(*parts)}


def test_brace_patterns_are_exact():
    ids = [r.case_id for r in quick_plan()]
    for subset in (ids, ids[::3], ids[5:200:7], [i for i in ids if "ring" in i and "flex" not in i], ids[:1]):
        pairs = compact(subset)
        expanded = [_expand(pattern) for pattern, _ in pairs]
        assert [len(e) for e in expanded] == [count for _, count in pairs]
        assert set().union(*expanded) == set(subset) and sum(map(len, expanded)) == len(set(subset))
        assert len(pairs) < len(subset) or len(subset) == 1
    assert compact(["a/b", "a/c", "odd"]) == [("a/{b,c}", 2), ("odd", 1)]
    assert describe(ids, limit=60).count("`") == 2 and "and 1 more pattern" in describe(ids, limit=60)


def test_time_breakdown_adds_the_phases_and_measures_against_the_floor():
    from harness.run.timing import time_breakdown, time_line

    results = quick_plan()[:3]
    for result, phases in zip(results, ({"forward": 1.0, "gathers": 2.0}, {"forward": 3.0, "repeat": 1.0}, {}),
                              strict=True):
        result.extra["phases"], result.seconds = phases, phases.get("forward")
    breakdown = time_breakdown(results, startup_s=10.0, wall_s=30.0)
    assert breakdown["forward"] == 4.0 and breakdown["gathers"] == 2.0 and breakdown["baselines"] == 0.0
    # the repeat check's second run is the case's own work: in the floor, beside the cases' `seconds`
    assert breakdown["floor"] == 15.0 and breakdown["ratio to floor"] == round(30 / 15, 2)
    assert breakdown["other (capture, judging, waits)"] == 13.0  # 30 - 10 - 7
    assert time_line(breakdown, matrix.WIDTH) == (
        "time: 30s wall (other (capture, judging, waits) 13s, launch start-ups 10s, forward 4s, gathers 2s); "
        "floor 15s, 2.0x")  # as many parts as fit the width


def test_each_run_appends_its_breakdown_to_the_time_log_only_when_one_is_named(tmp_path, monkeypatch):
    from harness.run.timing import TIME_LOG, log_breakdown

    monkeypatch.delenv(TIME_LOG, raising=False)
    log_breakdown({"wall": 1.0}, launches=1)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(TIME_LOG, str(tmp_path / "time.jsonl"))
    log_breakdown({"wall": 1.0}, launches=1)
    log_breakdown({"wall": 2.5}, launches=3)
    assert [json.loads(line) for line in (tmp_path / "time.jsonl").read_text().splitlines()] == [
        {"launches": 1, "time_breakdown": {"wall": 1.0}}, {"launches": 3, "time_breakdown": {"wall": 2.5}}]


def test_terminal_links_each_failing_case_and_wraps_its_reason():
    """Under each failing case: its reason wrapped within 120 columns (at most 4 lines, the page has it whole) and
    the page link that opens it (`<page>#case-<id>`); no link without a page."""
    results = quick_plan()
    long = next(r for r in results if r.case_id == "qwenimage/ulysses4/flex/bf16/image")
    long.reason = "rank 1: RuntimeError: " + "shape mismatch " * 60
    text = matrix.terminal(results, page="reports/index.html")
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120
    at = lines.index(next(line for line in lines if "qwenimage/ulysses4/flex/bf16/image" in line))
    block = lines[at:at + 6]
    assert block[0].startswith("  ERROR   qwenimage/ulysses4/flex/bf16/image  rank 1: RuntimeError: shape")
    assert block[3].endswith("[...]") and all(line.startswith(" " * 10) for line in block[1:5])
    assert block[4] == " " * 10 + "reports/index.html#case-qwenimage/ulysses4/flex/bf16/image"
    for case_id in FAILING:
        assert f"          reports/index.html#case-{case_id}" in lines
    assert "#case-" not in matrix.terminal(results)  # the control: no page given, no link


def test_terminal_links_stay_within_the_width_for_a_long_report_path():
    results = [r for r in quick_plan() if r.case_id in FAILING]
    page = "/a/very/long/report/folder/" + "deep/" * 20 + "index.html"
    lines = matrix.terminal(results, page=page).splitlines()
    assert max(map(len, lines)) <= 120
    assert any(line.strip().startswith("#case-flux/ring2/_native_flash/fp32/tensor in /a/very") for line in lines)
