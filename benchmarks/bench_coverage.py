"""What `harness run --coverage` costs: the same plan without and with it, alternated so that a machine's load
changes hit both alike, and the ratio of the medians (wall time, and the cases' own time on rank 0, which is where
coverage's tracer slows Python down).

    python benchmarks/bench_coverage.py [--repeat N] [extra `harness run` arguments...]

The default plan is a slice of the quick plan that runs every family of diffusers' parallel code on CPU (Ulysses,
ring, the *any layouts, tensor parallelism, one and two models), eager; extra arguments replace it. Prints a Markdown
table for docs/measured.md. References must exist (the first `harness run` captures them).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.core.header import RunHeader
from harness.core.results import RESULTS_FILE, CaseResult, Status, read_results

PLAN = ["--models", "flux,qwenimage", "--layouts", "single,ulysses2,ring2,ulysses2any,ring2any,tp2",
        "--backends", "native,_native_flash", "--dtypes", "fp32", "--kinds", "tensor,removal", "--shapes", "default",
        "--modes", "eager"]


def timed_run(args: list[str], report_dir: Path) -> tuple[float, RunHeader, list[CaseResult]]:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "run", "--report-dir", str(report_dir), *args],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - started, *read_results(report_dir / RESULTS_FILE))


def case_seconds(cases: list[CaseResult]) -> float:
    return sum(case.seconds or 0 for case in cases if case.status is not Status.SKIP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    known, extra = parser.parse_known_args()
    plan = extra or PLAN
    walls, cases, summary = {False: [], True: []}, {False: [], True: []}, ""
    statuses = {}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(known.repeat):
            for covered in (False, True):
                args = [*plan, *(["--coverage"] if covered else [])]
                wall, header, run = timed_run(args, Path(scratch) / f"run{index}-{covered}")
                walls[covered].append(wall)
                cases[covered].append(case_seconds(run))
                statuses[covered] = sorted((c.case_id, c.status.value) for c in run)
                summary = (header.coverage or {}).get("summary", summary)
    ran = sum(status != "SKIP" for _, status in statuses[False])
    print(f"plan: `harness run {' '.join(plan)}` ({ran} cases run), {known.repeat} runs each, alternated\n")
    print("| figure | without | with `--coverage` | ratio |\n|---|---|---|---|")
    for name, values in (("wall time, median", walls), ("cases' own time on rank 0, median", cases)):
        before, after = statistics.median(values[False]), statistics.median(values[True])
        each = " / ".join(", ".join(f"{v:.0f}" for v in values[covered]) for covered in (False, True))
        print(f"| {name} (each: {each} s) | {before:.1f} s | {after:.1f} s | **{after / before:.2f}x** |")
    print(f"\nsame statuses with and without: {statuses[False] == statuses[True]}")
    print(f"coverage: {summary}")


if __name__ == "__main__":
    main()
