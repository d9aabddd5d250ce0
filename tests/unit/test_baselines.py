"""Single-device baselines computed once per run (harness.engine.baselines): a one-rank case's own output is the
baseline of its model, dtype and backend, handed to later launches through the run's folder, and equal to the
baseline computed afresh; a case with a fault never stands in for one."""

from pathlib import Path

import pytest
import torch

from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.engine.baselines import Baselines
from harness.engine.casework import measure, run_case
from harness.engine.context import RankContext
from harness.rank import backends

REFERENCES = Path(__file__).resolve().parents[2] / "references"


@pytest.fixture(autouse=True)
def counted_backends():
    backends.install_dispatch_counters()


def _case(layout: str, fault: str | None = None) -> Case:
    return Case(model="flux", layout=parse_layout(layout), backend="_native_flash", dtype="bf16", fault=fault)


def _never(*_):
    raise AssertionError("a later launch recomputed a baseline an earlier one had handed on")


def _baselines(shared: Path | None = None) -> Baselines:
    return Baselines(RankContext(REFERENCES, None, torch.device("cpu")), shared)


def _one_rank_launch(shared: Path, case: Case) -> torch.Tensor:
    baselines = _baselines(shared)
    output, _ = run_case(baselines.context, case)
    measure(baselines.context, baselines, case, output)
    return output


def test_a_one_rank_output_is_the_baseline_later_launches_read(tmp_path):
    output = _one_rank_launch(tmp_path, _case("single"))
    later = _baselines(tmp_path)
    later._compute = _never
    handed = later.of(_case("ulysses2"))
    afresh = _baselines().of(_case("ulysses2"))  # nothing shared
    assert torch.equal(handed, output.float()) and torch.equal(handed, afresh)


def test_a_case_with_a_fault_never_stands_in_for_a_baseline(tmp_path):
    faulty = _one_rank_launch(tmp_path, _case("single", fault="scaled_softmax"))
    later = _baselines(tmp_path)
    computed = []
    original = later._compute
    later._compute = lambda *args: computed.append(args) or original(*args)
    baseline = later.of(_case("ulysses2"))
    assert computed and not torch.equal(baseline, faulty.float())  # computed here, without the fault
    assert later.of(_case("ulysses2")) is baseline and len(computed) == 1  # and once
