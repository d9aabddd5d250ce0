"""`harness run --coverage` in real ranks: the coverage follows the plan. Adding a layout raises the figure of the
module it exercises (ulysses2any runs the context-parallel hooks' *anything sharders, which ulysses2 alone never
does, and the first run says so: not in this plan, the layout `ulysses2any`), and every view carries it. Two runs
in one test: the comparison is the test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.core.coverage import NOT_IN_PLAN, read
from harness.core.header import RunHeader

pytestmark = pytest.mark.slow

HOOKS = "hooks/context_parallel.py"
SHARDER = "PartitionAnythingSharder.shard_anything"


def run(project, layouts: str, out: str):
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--models", "flux", "--layouts", layouts,
                           "--backends", "native", "--dtypes", "fp32", "--kinds", "tensor", "--shapes", "default",
                           "--coverage", "--report-dir", out], cwd=project, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    header = json.loads((project / out / "results.json").read_text())["header"]
    return done.stdout, read(RunHeader.from_dict(header))


def function(report, module: str, name: str):
    found = next(m for m in report.modules if m.key == module)
    return found, next(f for f in found.functions if f.name == name)


def test_adding_a_layout_raises_the_figure_of_the_module_it_exercises(project):
    said, before = run(project, "ulysses2", "before")
    _, after = run(project, "ulysses2,ulysses2any", "after")
    hooks_before, sharder_before = function(before, HOOKS, SHARDER)
    hooks_after, sharder_after = function(after, HOOKS, SHARDER)
    assert hooks_after.executed > hooks_before.executed
    assert sharder_before.executed == [] and sharder_after.executed == sharder_after.statements
    assert {(gap.category, gap.why) for gap in sharder_before.gaps} == {
        (NOT_IN_PLAN, "the layout `ulysses2any` (Ulysses-anything shards and gathers unevenly)")}
    # what ulysses2 runs is executed in both runs: the data of every rank process were combined
    _, pre_forward = function(before, HOOKS, "ContextParallelSplitHook.pre_forward")
    assert pre_forward.executed and before.processes == 2  # both ranks of the one ulysses2 launch
    assert before.summary() in said  # the terminal's line
    assert before.summary() in (project / "before" / "matrix.md").read_text()
    assert 'id="coverage"' in (project / "before" / "index.html").read_text()
