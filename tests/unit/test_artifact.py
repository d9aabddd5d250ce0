"""The report folder is the artifact a CI job uploads: after a real run it holds what a reviewer reads and nothing
else; the lock, Inductor's cache and the work files (checkpoints of the `pretrained` load included) are beside it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.results import Status, read_results

REPO = Path(__file__).resolve().parents[2]
REVIEWED = {"index.html", "results.json", "matrix.csv", "matrix.md", "images"}  # images: only where a case has any


@pytest.mark.slow
def test_a_finished_runs_report_folder_holds_only_what_a_reviewer_reads(project, zoo_references):
    ran = subprocess.run([sys.executable, "-m", "harness", "run", "--models", "flux", "--layouts", "ulysses2",
                          "--kinds", "tensor", "--dtypes", "fp32", "--modes", "eager", "--loads", "enable,pretrained",
                          "--references", str(zoo_references), "--known-issues", str(REPO / "known_issues.toml"),
                          "--report-dir", "out"], cwd=project, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "(" + str(project / "out.work" / "launches" / "checkpoints") + ")" in ran.stdout  # written, then tidied
    statuses = {result.case_id: result.status for result in read_results(project / "out" / "results.json")[1]}
    assert statuses["flux/ulysses2/native/fp32/tensor/pretrained"] is Status.XFAIL, statuses
    written = {path.name for path in (project / "out").iterdir()}
    assert {"index.html", "results.json", "matrix.csv", "matrix.md"} <= written <= REVIEWED, written
    beside = {path.name for path in (project / "out.work").iterdir()}
    assert "run.lock" in beside and "launches" not in beside, beside  # every case ended well: the work files went
