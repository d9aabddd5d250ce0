"""`harness selftest`: prove on this stack that a PASS means something.

Runs real cases with deliberate bugs (harness.faults) next to the same cases without them. The harness passes
its own test only if every faulty case is FAIL and every clean twin is PASS.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from harness import runner
from harness.layouts import parse_layout
from harness.plan import Case, PlannedCase, skip_reason
from harness.plan import max_ranks
from harness.results import Status
from harness.settings import Settings

# (model, layout, backend, dtype, fault, what the FAIL reason must say)
CONTROLS = [
    ("flux", "ulysses2", "native", "fp32", "cp_local_attention", "> tolerance"),
    ("flux", "ring2", "_native_flash", "fp32", "cp_local_attention", "> tolerance"),
    ("flux", "ulysses2", "native", "bf16", "cp_local_attention", "error budget"),
    ("flux", "ring2", "_native_flash", "bf16", "extra_rounding", "error budget"),
    ("qwenimage", "ulysses2", "native", "fp32", "cp_local_attention", "> tolerance"),
    ("flux", "tp2", "native", "fp32", "tp_skip_allreduce", "> tolerance"),
    ("flux2", "tp2", "native", "fp32", "tp_skip_allreduce", "> tolerance"),
    ("flux", "single", "_native_math", "fp32", "redirect_dispatch", "requested _native_math, dispatched native"),
    ("flux", "tp2", "_native_math", "fp32", "math_runs_flash", "but kernel(s) aten::_scaled_dot_product_flash"),
    ("flux", "single", "native", "fp32", "scaled_softmax", "> tolerance"),
]


def control_plan(cpu_max_ranks: int) -> list[PlannedCase]:
    plan = []
    limit = max_ranks(cpu_max_ranks)
    for model, layout, backend, dtype, fault, _ in CONTROLS:
        faulty = Case(model, parse_layout(layout), backend, dtype, fault=fault)
        for case in (replace(faulty, fault=None), faulty):
            plan.append(PlannedCase(case, skip_reason(case, limit)))
    return plan


def selftest(settings: Settings, echo: Callable[[str], None] = print) -> int:
    summary = runner.run(settings, control_plan(settings.cpu_max_ranks), echo=echo)
    by_id = {result.case_id: result for result in summary.results}
    ok = True
    echo("\nselftest: each deliberate bug must FAIL, and its clean twin must PASS")
    for model, layout, backend, dtype, fault, expected in CONTROLS:
        clean_id = f"{model}/{layout}/{backend}/{dtype}/tensor"
        clean, faulty = by_id[clean_id], by_id[f"{clean_id}+{fault}"]
        caught = faulty.status is Status.FAIL and expected in faulty.reason and clean.status is Status.PASS
        ok &= caught
        verdict = "caught " if caught else "MISSED "
        echo(f"  {verdict} {fault:20s} {clean_id:40s} clean={clean.status.value} faulty={faulty.status.value}"
             f"  {faulty.reason}")
    echo("selftest passed: the harness caught every deliberate bug" if ok else
         "selftest FAILED: a deliberate bug went unreported, so a PASS from this stack proves nothing")
    return 0 if ok else 1
