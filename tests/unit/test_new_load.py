"""Adding a load is one declaration on its own code, in a module of your own (harness/loads/__init__.py:
`HARNESS_LOADS`): planned under its name, built by every rank its way, and judged like any case."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

TOY = '''
"""Two toy loads: one that marks each model it prepares, one that loads wrong weights (the judge must see it)."""

from pathlib import Path

from harness.loads import memory_load


@memory_load("the model as enable builds it, each rank leaving a mark that this code prepared it")
def toy_marked(model, device):
    import torch.distributed as dist

    Path({marks!r}, f"rank{{dist.get_rank()}}").write_text(type(model).__name__)


@memory_load("the model's first block's query weight doubled: a load that reads the wrong weights")
def toy_doubled(model, device):
    import torch

    with torch.no_grad():
        model.transformer_blocks[0].attn.to_q.weight.mul_(2)
'''


def test_a_load_of_your_own_is_planned_built_by_each_rank_and_judged(project, monkeypatch):
    marks = project / "marks"
    marks.mkdir()
    (project / "toy_load.py").write_text(TOY.format(marks=str(marks)))
    monkeypatch.setenv("PYTHONPATH", f"{project}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("HARNESS_LOADS", "toy_load")
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--models", "flux", "--layouts", "ulysses2",
                           "--backends", "native", "--dtypes", "fp32", "--kinds", "tensor",
                           "--loads", "enable,toy_marked,toy_doubled", "--load-cases", "*", "--report-dir", "out"],
                          cwd=project, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr  # toy_doubled FAILs
    with open(project / "out/matrix.csv") as handle:
        rows = {row["case_id"]: row for row in csv.DictReader(handle)}
    statuses = {case_id: row["status"] for case_id, row in rows.items() if case_id.startswith("flux/")}
    assert statuses == {"flux/ulysses2/native/fp32/tensor": "PASS",
                        "flux/ulysses2/native/fp32/tensor/toy_marked": "PASS",
                        "flux/ulysses2/native/fp32/tensor/toy_doubled": "FAIL"}, done.stdout
    assert rows["flux/ulysses2/native/fp32/tensor/toy_marked"]["load"] == "toy_marked"
    # the toy's code ran on each rank of its case, and nowhere else (the baselines and the enable case build `enable`)
    assert {path.name: path.read_text() for path in marks.iterdir()} == \
        {"rank0": "FluxTransformer2DModel", "rank1": "FluxTransformer2DModel"}


def test_a_load_not_registered_is_refused_naming_the_valid_ones(project):
    refused = subprocess.run([sys.executable, "-m", "harness", "run", "--models", "flux", "--loads", "toy_marked",
                              "--report-dir", "out"], cwd=project, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "unknown load 'toy_marked'; valid loads: enable, pretrained" in refused.stderr
