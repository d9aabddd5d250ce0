"""Real records for the tests of what reads results.json (`harness ab`, bisect, the GPU summary, results_diff): a
real run's file, and records judged by the harness's own verdict, so a field that moves fails these tests instead of
leaving a fixture of its old layout passing."""

from __future__ import annotations

from pathlib import Path

from harness.core.layouts import parse_layout
from harness.core.records import Case, CaseRecord, Outcome
from harness.core.results import CaseResult
from harness.run.verdict import judge
from tests.judging import settings

# Written by `harness run --models flux --layouts single,ulysses2,tp2 --train-layouts ulysses2 --kinds tensor,train
# --dtypes fp32,bf16 --backends native --modes eager` (torch 2.13.0 CPU, diffusers 0.42.1; 8 PASS), each case's
# `extra` cut to `train` and `phases`, one case a line. The train kind runs no single layout in it, as in the quick
# plan: its single-device run is measured inside the ulysses2 cases only.
REAL_RUN = Path(__file__).resolve().parent / "unit" / "data" / "results_flux_small.json"


def tensor_case(case_id: str, max_abs_err: float, vs_single: float | None = None) -> CaseResult:
    """A tensor case of `model/layout/backend/dtype/tensor` as `harness run` records it: the numbers its ranks
    measured (the max abs error against the reference, the layout against its single-device run) judged by the
    verdict with the project's limits."""
    model, layout, backend, dtype, kind = case_id.split("/")
    case = Case(model, parse_layout(layout), backend, dtype, kind)
    metrics = {"max_abs_err": max_abs_err, "mean_abs_err": max_abs_err / 4, "max_rel_err": max_abs_err,
               "nonfinite": 0}
    if vs_single is not None:
        metrics["vs_baseline_max_abs"] = vs_single
    record = CaseRecord(case.case_id, seconds=0.1, dispatched={backend: 2}, metrics=metrics)
    return judge(Outcome(case, record), settings())
