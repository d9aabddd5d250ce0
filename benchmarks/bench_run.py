"""Time `harness run` on the default plan, count its torchrun launches, and show where the time went against the
floor (launch start-ups plus the cases' own time) and the ratio to it.

Also times one single-case launch, to show what batching many cases per launch saves. Usage:

    python benchmarks/bench_run.py [--repeat N] [extra `harness run` arguments...]

Prints a Markdown table for the docs (docs/measured.md). References must exist (the first `harness run` captures them).
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


def timed_run(args: list[str], report_dir: Path) -> tuple[float, RunHeader, list[CaseResult]]:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "run", "--report-dir", str(report_dir), *args],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - started
    return (wall, *read_results(report_dir / RESULTS_FILE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    known, extra = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as scratch:
        walls, ratios, floors = [], [], []
        for index in range(known.repeat):
            wall, header, cases = timed_run(extra, Path(scratch) / f"run{index}")
            walls.append(wall)
            floors.append(header.time_breakdown["floor"])
            ratios.append(wall / floors[-1])
        ran = [c for c in cases if c.status is not Status.SKIP]
        single = ["--models", "flux", "--layouts", "ulysses2", "--backends", "native", "--dtypes", "fp32",
                  "--kinds", "tensor"]
        one_wall, _, _ = timed_run([*extra, *single], Path(scratch) / "one")
    forward = sum(c.seconds or 0 for c in ran)
    print("| figure | value |\n|---|---|")
    print(f"| cases planned / run (non-SKIP) | {len(cases)} / {len(ran)} |")
    print(f"| torchrun launches | {header.launches} (world sizes {header.world_sizes}) |")
    print(f"| `harness run` wall time, median of {known.repeat} (each: {', '.join(f'{w:.0f}' for w in walls)} s) | "
          f"{statistics.median(walls):.1f} s |")
    print(f"| floor: launch start-ups + the cases' own time, median | {statistics.median(floors):.1f} s |")
    print(f"| **ratio wall / floor**, median (each: {', '.join(f'{r:.2f}' for r in ratios)}) | "
          f"**{statistics.median(ratios):.2f}x** |")
    print(f"| sum of per-case times on rank 0 (build + enable_parallelism + recorded run) | {forward:.1f} s |")
    print(f"| one `harness run` with a single case (launch + imports + gloo init) | {one_wall:.1f} s |")
    print(f"| estimated wall time with one launch per case | {one_wall * len(ran):.0f} s |")
    print("\n| where the last run's time went | seconds |\n|---|---|")
    for name, value in header.time_breakdown.items():
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
