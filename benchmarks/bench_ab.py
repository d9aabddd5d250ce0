"""How long `harness ab` takes cold (no environment cached: both are built) and warm (the same command again: nothing
is built, the base's references are reused).

    python benchmarks/bench_ab.py [--base diffusers==0.38.0] [--head diffusers==0.39.0] [--cache DIR] [plan options]

The cold run uses a fresh environment cache (a temporary folder unless --cache is given) and pip's own download
cache as it is (the wheels are on disk after any earlier install). Wall time is measured around each `harness ab`
process; the phases are those `ab` prints on its `time:` line.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN = ["--models=qwenimage", "--shapes=masked", "--layouts=ulysses2", "--backends=native", "--dtypes=fp32",
        "--kinds=tensor"]


def run_ab(base: str, head: str, plan: list[str], cache: Path, report_dir: Path) -> tuple[float, int, str]:
    command = [sys.executable, "-m", "harness", "ab", "--base", base, "--head", head, *plan,
               f"--env-cache={cache}", f"--report-dir={report_dir}"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - started
    phases = next((line for line in done.stdout.splitlines() if line.startswith("time: ")), "time: (none)")
    if done.returncode not in (0, 1):
        sys.exit(f"harness ab failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, done.returncode, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="diffusers==0.38.0")
    parser.add_argument("--head", default="diffusers==0.39.0")
    parser.add_argument("--cache", default=None, help="Environment cache for the cold run (default: a fresh one).")
    args, plan = parser.parse_known_args()
    plan = plan or PLAN
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as scratch:
        cache = Path(args.cache) if args.cache else Path(scratch) / "envs"
        rows = []
        for name in ("cold", "warm"):
            wall, code, phases = run_ab(args.base, args.head, plan, cache, Path(scratch) / "report")
            rows.append((name, wall, code, phases))
            print(f"{name}: {wall:.0f} s wall (exit {code}); {phases}", flush=True)
    print(f"\n| `harness ab --base {args.base} --head {args.head} {' '.join(plan)}` | wall | phases |")
    print("|---|---|---|")
    for name, wall, _code, phases in rows:
        print(f"| {name} | {wall:.0f} s | {re.sub(r'^time: ', '', phases)} |")


if __name__ == "__main__":
    main()
