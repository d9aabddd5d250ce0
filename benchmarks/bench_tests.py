"""Where the test command's time goes: per test file and per slow test, the test's own wall time and, summed from
the `time_breakdown` of every harness run the tests made, launch start-ups, compiling, model builds and the cases'
own compute.

Runs pytest with `--durations=0` and a JUnit XML into a scratch folder, with benchmarks/timed_items.py pointing
`HARNESS_TIME_LOG` at a file per test item, to which every harness run of that item (in the pytest process, an xdist
worker, a `harness run` or a pytest the test starts) appends its breakdown (harness.run.timing). Usage:

    python benchmarks/bench_tests.py [-n 2] [--slow-s 5] [--write-durations] [pytest selection ...]

e.g. `python benchmarks/bench_tests.py tests/unit/test_compile.py -m slow`. Prints Markdown tables for
docs/measured.md. Times are wall seconds on whatever else the machine runs: say so beside the figures.
`--write-durations` also writes each file's wall seconds to tests/durations.json, the order in which pytest-xdist
hands the files to its workers (tests/conftest.py): run it on the whole test command, quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

from timed_items import FOLDER, log_file

DURATIONS = Path(__file__).resolve().parents[1] / "tests" / "durations.json"

PARTS = ("runs", "launches", "launch start-ups", "compile", "model build", "compute")
HEAD = "| {what} | wall (s) | " + " | ".join(PARTS) + " |\n|---|---:|" + "---:|" * len(PARTS)


def run_pytest(selection: list[str], workers: str, scratch: Path) -> float:
    """The whole pytest session's wall time; its JUnit XML and the runs' time log land in `scratch`."""
    command = [sys.executable, "-m", "pytest", *selection, "-p", "timed_items", "--durations=0", "-q",
               "-o", "junit_family=xunit1", f"--junitxml={scratch / 'junit.xml'}"] + (
        ["-n", workers] if workers != "0" else [])
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    (scratch / "logs").mkdir()
    started = time.perf_counter()
    subprocess.run(command, env={**os.environ, "PYTHONPATH": path, FOLDER: str(scratch / "logs")}, check=False)
    return time.perf_counter() - started


def item_times(junit: Path) -> dict[str, float]:
    """Each test's setup, call and teardown seconds by node id (xunit1 names the file)."""
    times = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        path, name = case.get("file", ""), case.get("name", "")
        parent = case.get("classname", "").rsplit(".", 1)
        owner = f"::{parent[1]}" if len(parent) == 2 and parent[1][:1].isupper() else ""
        times[f"{path}{owner}::{name}"] = float(case.get("time", 0.0))
    return times


def run_parts(logs: Path, nodeid: str) -> dict[str, float]:
    """The item's runs' breakdowns summed: runs, launches, start-ups, compile, model build, compute."""
    summed = dict.fromkeys(PARTS, 0.0)
    log = log_file(logs, nodeid)
    for entry in map(json.loads, log.read_text().splitlines() if log.exists() else []):
        times = entry["time_breakdown"]
        own = times["floor"] - times["launch start-ups"]  # the cases' own time, compile and build in it
        summed["runs"] += 1
        summed["launches"] += entry["launches"]
        summed["launch start-ups"] += times["launch start-ups"]
        summed["compile"] += times.get("compile", 0.0)
        summed["model build"] += times.get("model build", 0.0)
        summed["compute"] += own - times.get("compile", 0.0) - times.get("model build", 0.0)
    return summed


def row(what: str, wall: float, parts: dict[str, float]) -> str:
    return f"| {what} | {wall:.1f} | " + " | ".join(f"{parts[name]:.0f}" if name in ("runs", "launches")
                                                     else f"{parts[name]:.1f}" for name in PARTS) + " |"


def report(times: dict[str, float], logs: Path, slow_s: float, wall: float) -> None:
    parts = {node: run_parts(logs, node) for node in times}
    by_file: dict[str, list[str]] = defaultdict(list)
    for node in times:
        by_file[node.split("::")[0]].append(node)
    print(f"pytest session wall: {wall:.0f} s, {len(times)} tests\n")
    print(HEAD.format(what="test file"))
    for path in sorted(by_file, key=lambda name: -sum(times[node] for node in by_file[name])):
        summed = {name: sum(parts[node][name] for node in by_file[path]) for name in PARTS}
        print(row(path, sum(times[node] for node in by_file[path]), summed))
    print("\n" + HEAD.format(what=f"test of {slow_s:.0f} s or more"))
    for node in sorted((node for node in times if times[node] >= slow_s), key=lambda node: -times[node]):
        path, name = node.split("::", 1)
        print(row(f"`{Path(path).name}::{name}`", times[node], parts[node]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", dest="workers", default="2", help="pytest-xdist workers (0: none).")
    parser.add_argument("--slow-s", type=float, default=5.0, help="List each test that took this long or more.")
    parser.add_argument("--write-durations", action="store_true", help=f"Write each file's seconds to {DURATIONS}.")
    known, selection = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        wall = run_pytest(selection, known.workers, scratch)
        if not (scratch / "junit.xml").exists():
            sys.exit("pytest wrote no JUnit XML: see its output above")
        times = item_times(scratch / "junit.xml")
        report(times, scratch / "logs", known.slow_s, wall)
        if known.write_durations:
            write_durations(times)


def write_durations(times: dict[str, float]) -> None:
    by_file: dict[str, float] = defaultdict(float)
    for node, seconds in times.items():
        by_file[node.split("::")[0]] += seconds
    DURATIONS.write_text(json.dumps({path: round(by_file[path], 1) for path in sorted(by_file)}, indent=0) + "\n")


if __name__ == "__main__":
    main()
