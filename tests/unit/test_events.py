"""The rank events are typed both ways: what the worker writes is what the launcher reads, and a line of another
kind or with fields nobody writes is an error, not something skipped."""

import json

import pytest

from harness.core import events
from harness.core.records import CaseRecord


@pytest.mark.parametrize("event", [
    events.Hello(1, 12.5, 4242, node=1, host="h"), events.Start(0, 1.0, "flux/single/native/fp32/tensor"),
    events.RankError(1, 2.0, "x", "RuntimeError: boom", "tb"), events.Fatal(3, 4.0, 99, "startup", "ImportError"),
    events.Result(0, 5.0, CaseRecord("x", seconds=0.5, dispatched={"native": 2})), events.Done(2, 6.0)])
def test_an_event_reads_back_as_written(event):
    assert events.from_dict(json.loads(events.to_line(event))) == event


def test_an_unknown_event_or_field_is_refused():
    with pytest.raises(ValueError):
        events.from_dict({"event": "goodbye", "rank": 0, "time": 1.0})
    with pytest.raises(ValueError, match="unknown fields"):
        events.from_dict({"event": "start", "rank": 0, "time": 1.0, "case_id": "x", "extra": 1})


def test_only_a_stuck_group_is_asked_for_its_stacks():
    assert {problem for problem in events.Problem if problem.stuck} == {events.Problem.HUNG, events.Problem.TIMEOUT}


def test_a_record_that_cannot_be_written_is_the_case_s_error_not_the_launch_s():
    """Found compiling Wan: a symbolic size in a record dragged fake tensors into it, the record could not be
    written, and the rank died with the launch's other cases."""
    import io

    from harness.core.records import CaseRecord
    from harness.engine.worker import Worker

    worker = object.__new__(Worker)
    worker.rank, worker.events = 0, io.StringIO()
    worker.report(CaseRecord("flux/single/native/fp32/tensor", metrics={"max_abs_err": object()}))
    event = events.from_dict(json.loads(worker.events.getvalue()))
    assert event.record.case_id == "flux/single/native/fp32/tensor"
    assert event.record.error.startswith("the case's record could not be written: TypeError")
