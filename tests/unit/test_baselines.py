"""Single-device baselines computed once per run (harness.engine.baselines): a one-rank case's own output is the
baseline of its model, dtype and backend, handed to later launches through the run's folder, and equal to the
baseline computed afresh; a case with a fault never stands in for one. A rank other than 0 computes what later cases
will ask for while rank 0 measures (Prefetch)."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.engine.baselines import Baselines, Prefetch
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


def _prefetched_all(shared: Path, cases: list[Case]) -> list[tuple]:
    """Rank 1's side: prefetch after the first case until nothing is missing; the keys computed, in order."""
    rank1 = _baselines(shared)
    computed = []
    original = rank1._compute
    rank1._compute = lambda case, *args: computed.append(case.case_id) or original(case, *args)
    prefetch = Prefetch(rank1, cases)
    while True:
        before = len(computed)
        prefetch.after(0, 0)
        if len(computed) == before:
            return computed


def test_a_rank_prefetches_every_baseline_a_later_case_is_measured_with(tmp_path):
    """What another rank prefetched (a flow case in bf16: its fp32 one-device flow run, its own baseline, its noise
    draws) is all that measuring the case asks for: rank 0 computes nothing."""
    now, later = _case("single"), replace(_case("single"), flow="lora")
    computed = _prefetched_all(tmp_path, [now, later])
    assert len(computed) == len(_baselines().wanted(later)) >= 3
    rank0 = _baselines(tmp_path)
    rank0._compute = _never
    output, _ = run_case(rank0.context, later)
    metrics = measure(rank0.context, rank0, later, output)
    assert metrics["flow"]["effect"] > 0 and metrics["flow"]["one_device_changes"]


def test_a_prefetch_runs_beside_rank0s_own_and_shares_the_missing_ones_out(tmp_path):
    now = _case("ulysses2")
    first, second = replace(now, dtype="fp32"), replace(now, backend="native", dtype="fp32")
    rank1 = _baselines(tmp_path)
    taken = []
    rank1.of = lambda case, draw=None: taken.append((case.case_id, draw))
    Prefetch(rank1, [now, now, first, second]).after(0, 1)  # the second missing one: rank 2's share
    assert taken == [(second.case_id, None)]
    taken.clear()
    Prefetch(rank1, [now, now]).after(0, 0)  # nothing but what rank 0 computes now
    assert taken == []
    tmp_path.mkdir(exist_ok=True)
    for asked, draw in rank1.wanted(now):  # rank 0 finds all of `now`'s shared: it computes nothing to run beside
        rank1._file(rank1.key_of(asked, draw)).touch()
    Prefetch(rank1, [now, first, second]).after(0, 0)
    assert taken == []


def test_a_prefetch_is_as_costly_as_what_rank0_computes_beside_it(tmp_path):
    """A compile beside an eager forward would keep rank 0 waiting for rank 1: each takes one of its own cost."""
    eager, compiled = _case("ulysses2"), replace(_case("ulysses2"), mode="compile")
    later_compiled = replace(compiled, dtype="fp32")
    later_eager = replace(eager, dtype="fp32")
    rank1 = _baselines(tmp_path)
    taken = []
    rank1.of = lambda case, draw=None: taken.append(case.case_id)
    Prefetch(rank1, [eager, later_compiled, later_eager]).after(0, 0)
    Prefetch(rank1, [compiled, later_eager, later_compiled]).after(0, 0)
    assert taken == [later_eager.case_id, later_compiled.case_id]
