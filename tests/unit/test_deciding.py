"""The check that decided a case: the one of its checks that used most of its allowance, as a ratio to its limit in
the right direction, with how its limit was derived; and the views (cell, CSV, Markdown) that show it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.core import figures
from harness.core.layouts import parse_layout
from harness.core.records import Case, CaseRecord, Outcome
from harness.core.results import CaseResult, Status
from harness.kinds import kind_of
from harness.report import matrix
from harness.run.verdict import judge, settle
from tests.judging import settings
from tests.unit.test_training import _metrics

NOISE = {"nudged:1": 7.81e-3, "nudged:2": 7.0e-3, "math_kernel": 2.0e-3, "split_reduction": 7.5e-3}


def _tensor(dtype: str, **metrics) -> CaseResult:
    base = {"max_abs_err": 7.1e-3, "mean_abs_err": 2.7e-3, "max_rel_err": 1e-2, "nonfinite": 0,
            "baseline": {"mean_abs_err": 2.67e-3, "max_abs_err": 7.0e-3}, "vs_baseline_max_abs": 5.86e-3,
            "noise": NOISE}
    case = Case("flux", parse_layout("ulysses2"), "native", dtype)
    record = CaseRecord(case.case_id, seconds=0.1, dispatched={"native": 2}, metrics={**base, **metrics})
    return judge(Outcome(case, record), settings(0.15))


def test_a_bf16_tensor_case_is_decided_by_its_same_dtype_check_with_the_limits_derivation():
    result = _tensor("bf16")
    assert result.status is Status.PASS
    decided = result.deciding
    assert decided["name"] == "vs_baseline_max_abs" and decided["limit"] == pytest.approx(2 * 7.81e-3)
    assert decided["margin"] == pytest.approx(5.86e-3 / 0.01562)
    assert "2.0 x the noisiest of its 4 single-device bf16 draws (0.00781" in decided["text"]
    assert result.cell == "vs 1-dev 0.38x"
    # the negative control: a same-dtype difference below a worse error against fp32 leaves that one deciding
    against_fp32 = _tensor("bf16", max_abs_err=0.14, vs_baseline_max_abs=1e-4, baseline={"mean_abs_err": 2.67e-3,
                                                                                          "max_abs_err": 0.14})
    assert against_fp32.deciding["name"] == "max_abs_err" and "fixed, the bf16 entry of tensor_limits" in \
        against_fp32.deciding["text"]


def test_a_train_case_is_decided_by_its_worst_parameter_not_the_all_parameter_error():
    kind = kind_of("train")
    result = CaseResult("flux/tp2/native/fp32/train", "flux", "default", "train", "tp2", 2, "native", "fp32")
    metrics = _metrics(grad_err=1.71e-3, param_errors={"a.weight": {"rel_l2": 0.972, "max_abs": 1e-3},
                                                       "b.bias": {"rel_l2": 1e-7, "max_abs": 0}})
    settle(result, kind.judge(result, metrics, kind.policy(settings(), "fp32")))
    assert result.status is Status.FAIL
    decided = result.deciding
    assert (decided["name"], decided["subject"], decided["value"]) == ("worst_grad_err", "a.weight", 0.972)
    assert decided["margin"] == pytest.approx(0.972 / 1e-4)
    assert decided["text"].startswith("gradient rel L2 err of the parameter nearest its limit [a.weight] 0.972 > "
                                      "0.0001 (9720x of its allowance; limit: fixed, grad_rel of train_limits)")
    assert result.cell == "worst grad 9720x" and result.figure("grad_err") == 1.71e-3  # not the all-parameter one
    passing = CaseResult("x", "flux", "default", "train", "ulysses2", 2, "native", "fp32")
    settle(passing, kind.judge(passing, _metrics(), kind.policy(settings(), "fp32")))
    assert passing.status is Status.PASS and passing.deciding["margin"] < 1  # a PASS shows its margin too


def test_lower_bounds_are_margins_of_deficits_with_their_direction():
    from harness.kinds.image import PSNR, SSIM  # each must reach its limit


    figure = SSIM.of(0.999387, 0.99, "fixed, the bf16 entry of image_limits")
    decided = figures.deciding([figure, PSNR.of(52.0, 38.0)])
    assert decided["name"] == "ssim" and decided["margin"] == pytest.approx(0.000613 / 0.01)
    assert decided["text"] == ("SSIM 0.9994 >= 0.99 (0.06x of its allowance; limit: fixed, the bf16 entry of "
                               "image_limits)")
    below = figures.deciding([SSIM.of(0.98, 0.99)])
    assert below["margin"] == pytest.approx(2.0) and "SSIM 0.98 < 0.99" in below["text"]
    assert figures.margin(36.0, 38.0, ">=", None) == pytest.approx(10 ** 0.2)  # PSNR: the errors' ratio
    assert figures.margin(math.nan, 0.99, ">=", 1.0) == math.inf  # NaN never looks within its limit
    assert figures.margin(1.01, 1.25, "<=", 1.0) == pytest.approx(0.04)  # a budget over one device's own error
    # the page's figures table writes the same share; a figure from an older file (no bound) reads value / limit
    from harness.report import pack

    assert pack.ratio(SSIM.of(0.999387, 0.99)) == "0.06\u00d7"  # as the text above writes it
    assert pack.ratio({"value": 0.999387, "limit": 0.99}) == "1.01\u00d7"


def test_the_views_write_the_deciding_check(tmp_path):
    result = _tensor("bf16")
    failing = _tensor("bf16", vs_baseline_max_abs=0.05)
    assert failing.status is Status.FAIL and failing.cell == "vs 1-dev 3.20x"
    assert matrix._cell(failing) == "FAIL vs 1-dev 3.20x"
    results = [result, CaseResult.from_dict({**failing.to_dict(), "case_id": "flux/ring2/native/bf16/tensor",
                                             "layout": "ring2"})]
    matrix.write_csv(results, tmp_path / "matrix.csv")
    frame = pd.read_csv(tmp_path / "matrix.csv").set_index("case_id")
    assert frame.loc[result.case_id, "deciding_margin"] == pytest.approx(result.deciding["margin"])
    assert frame.loc[result.case_id, "deciding"].startswith("max abs diff to one device, same dtype 0.00586 <= ")
    text = matrix.markdown(results)
    assert "| `flux/ring2/native/bf16/tensor` | **FAIL** | max abs diff to one device, same dtype 0.05 > 0.01562 " \
           "(3.20x of its allowance; limit: 2.0 x the noisiest" in text
    old = CaseResult.from_dict({key: value for key, value in result.to_dict().items() if key != "deciding"})
    assert old.deciding is None and old.cell == "7.1e-03"  # a file from before it: the key figure, as it was


@pytest.mark.slow
def test_the_page_matrix_cells_read_the_deciding_check_in_a_browser(tmp_path):
    """Rendered and drawn by the page's script in Chromium: the bf16 tensor cell reads its same-dtype check, the
    train cell its worst parameter (not the all-parameter error the key figure would write)."""
    import json

    from harness.core.header import RunHeader
    from harness.core.results import payload_of
    from harness.report import render_html
    from tests.report_pages import OPEN_ALL, seen

    kind = kind_of("train")
    train = CaseResult("flux/tp2/native/fp32/train", "flux", "default", "train", "tp2", 2, "native", "fp32")
    metrics = _metrics(grad_err=1.71e-3, param_errors={"a.weight": {"rel_l2": 0.972, "max_abs": 1e-3}})
    settle(train, kind.judge(train, metrics, kind.policy(settings(), "fp32")))
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(payload_of([_tensor("bf16"), train], RunHeader.from_dict({}))))
    probe = ('window.__probe = function () { return Array.prototype.map.call(document.querySelectorAll('
             '"a.cell-case"), function (a) { return [a.getAttribute("href"), a.querySelector(".num").textContent]; '
             '}); };')
    got = seen(tmp_path, render_html(folder), "", OPEN_ALL + probe)
    cells = dict(got["extra"])
    assert cells == {"#case-flux/ulysses2/native/bf16/tensor": "vs 1-dev 0.38x",
                     "#case-flux/tp2/native/fp32/train": "worst grad 9720x"}


def test_a_check_held_to_exactly_its_limit_says_so_instead_of_an_infinite_share():
    """Ranks that must agree exactly (limit 0) have no allowance to share: the cell writes the value against 0 and the
    text says any difference fails, never `infx`; a check with an allowance (the control) writes its share."""
    exact = figures.deciding([], [{"check": "ranks_disagree", "text": "t", "subject": "loss", "value": 0.0037,
                                   "limit": 0.0}])
    assert exact["margin"] == math.inf and figures.decided_cell(exact) == "ranks disagree 0.0037 > 0"
    assert exact["text"] == "ranks disagree [loss] 0.0037 > 0 (exact: any difference from 0 fails)"
    assert "inf" not in figures.decided_cell(exact) + exact["text"]
    agreed = figures.deciding([], [{"check": "ranks_disagree", "text": "t", "value": 0.0, "limit": 0.0}])
    assert figures.decided_cell(agreed) == "ranks disagree 0.00x"
    allowed = figures.deciding([], [{"check": "grad_rel", "text": "t", "value": 0.5, "limit": 1e-4}])
    assert figures.decided_cell(allowed) == "grad rel 5000x"
    old = {key: value for key, value in exact.items() if key != "ideal"}  # a file from before `ideal` was kept
    assert figures.decided_cell({**old, "margin": "inf"}) == "ranks disagree 0.0037 > 0"
