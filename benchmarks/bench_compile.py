"""Compile time of a compiled case with Inductor's cache cold and warm: the same `harness run` twice with
one `--compile-cache` folder, empty the first time; each run's wall, its `compile` phase (rank 0's first, compiling
call of every case), the measured case seconds and the case's status. Usage:

    python benchmarks/bench_compile.py [--modes compile] [extra `harness run` arguments...]

Default slice: tiny flux, `single` and `ulysses2`, native, fp32, tensor. Prints a Markdown table for docs/compile.md.
References must exist (the first `harness run` captures them).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.core.results import RESULTS_FILE, CaseResult, read_results

SLICE = ["--models", "flux", "--layouts", "single,ulysses2", "--backends", "native", "--dtypes", "fp32",
         "--kinds", "tensor"]


def timed_run(args: list[str], report_dir: Path) -> tuple[float, list[CaseResult]]:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "run", "--report-dir", str(report_dir), *args],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started, read_results(report_dir / RESULTS_FILE)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="compile")
    known, extra = parser.parse_known_args()
    print("| cache | wall | case | status | compile phase (rank 0) | measured run |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "cache"
        for label in ("cold", "warm"):
            args = [*SLICE, *extra, "--modes", known.modes, "--compile-cache", str(cache)]
            wall, cases = timed_run(args, Path(scratch) / label)
            for case in cases:
                phases = case.extra.get("phases", {})
                print(f"| {label} | {wall:.0f} s | `{case.case_id}` | {case.status} | "
                      f"{phases.get('compile', 0.0):.1f} s | {phases.get('forward', 0.0):.3f} s |")


if __name__ == "__main__":
    main()
