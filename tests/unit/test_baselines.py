"""Single-device baselines computed once per run (harness.rank.casework): a one-rank case's own output is the
baseline of its model, dtype and backend, handed to later launches through the run's folder, and equal to the
baseline computed afresh; a case with a fault never stands in for one."""

from pathlib import Path

import pytest
import torch

from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.rank import backends
from harness.rank.casework import CaseWork

REFERENCES = Path(__file__).resolve().parents[2] / "references"


@pytest.fixture(autouse=True)
def counted_backends():
    backends.install_dispatch_counters()


def _case(layout: str, fault: str | None = None) -> Case:
    return Case(model="flux", layout=parse_layout(layout), backend="_native_flash", dtype="bf16", fault=fault)


def _never(*_):
    raise AssertionError("a later launch recomputed a baseline an earlier one had handed on")


def _one_rank_launch(shared: Path, case: Case) -> torch.Tensor:
    work = CaseWork(REFERENCES, None, torch.device("cpu"), shared)
    output, _ = work.run(case)
    work.measure(case, output)
    return output


def test_a_one_rank_output_is_the_baseline_later_launches_read(tmp_path):
    output = _one_rank_launch(tmp_path, _case("single"))
    later = CaseWork(REFERENCES, None, torch.device("cpu"), tmp_path)
    later._compute_baseline = _never
    handed = later.baseline(_case("ulysses2"))
    afresh = CaseWork(REFERENCES, None, torch.device("cpu")).baseline(_case("ulysses2"))  # nothing shared
    assert torch.equal(handed, output.float()) and torch.equal(handed, afresh)


def test_a_case_with_a_fault_never_stands_in_for_a_baseline(tmp_path):
    faulty = _one_rank_launch(tmp_path, _case("single", fault="scaled_softmax"))
    later = CaseWork(REFERENCES, None, torch.device("cpu"), tmp_path)
    computed = []
    original = later._compute_baseline
    later._compute_baseline = lambda *args: computed.append(args) or original(*args)
    baseline = later.baseline(_case("ulysses2"))
    assert computed and not torch.equal(baseline, faulty.float())  # computed here, without the fault
    assert later.baseline(_case("ulysses2")) is baseline and len(computed) == 1  # and once
