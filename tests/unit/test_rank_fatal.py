"""A rank that dies outside a case (an import in the shims, init, cleanup) is reported with its own traceback."""

import json
import subprocess
import sys
import time

import pytest

from harness.core import events
from harness.core.layouts import parse_layout
from harness.core.records import Case, GroupSpec, Outcome
from harness.engine import worker
from harness.rank import cpu
from harness.run.launch import _Launch
from harness.run.verdict import judge
from tests.judging import settings

CASE = Case("flux", parse_layout("ulysses2"), "native", "fp32")
IMPORT_ERROR = "ImportError: cannot import name 'tensor_parallel' from 'diffusers.hooks'"


def test_a_rank_that_fails_at_startup_writes_its_traceback(tmp_path, monkeypatch):
    def broken_shims():
        raise ImportError("cannot import name 'tensor_parallel' from 'diffusers.hooks'")

    group = tmp_path / "group.json"
    group.write_text(json.dumps(GroupSpec(str(tmp_path), str(tmp_path), None, []).to_dict()))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(cpu, "apply", broken_shims)
    with pytest.raises(ImportError):
        worker.main([str(group)])
    (event,) = [json.loads(line) for line in (tmp_path / "rank1.jsonl").read_text().splitlines()]
    assert (event["event"], event["rank"], event["stage"], event["message"]) == ("fatal", 1, "startup", IMPORT_ERROR)
    assert "broken_shims" in event["traceback"] and event["traceback"].rstrip().endswith(IMPORT_ERROR)


def _launch(tmp_path) -> _Launch:
    return _Launch(GroupSpec(str(tmp_path), str(tmp_path), None, [CASE]), tmp_path, 60.0, lambda outcome: None)


def _write(tmp_path, event: events.Event) -> None:
    with open(tmp_path / f"rank{event.rank}.jsonl", "a") as handle:
        handle.write(events.to_line(event) + "\n")


def test_the_case_reason_is_the_rank_traceback_not_torchruns_summary(tmp_path):
    launch = _launch(tmp_path)
    traceback = "Traceback (most recent call last):\n  ...\n" + IMPORT_ERROR
    _write(tmp_path, events.Fatal(1, time.time(), 4242, "startup", IMPORT_ERROR, traceback))
    launch.watch.poll()
    outcome = launch._outcome(CASE.case_id, events.Problem.EXITED, 1)
    assert outcome.record.traceback.endswith(IMPORT_ERROR)
    result = judge(outcome, settings())
    assert result.reason == f"rank 1: failed at startup: {IMPORT_ERROR}"
    assert "worker group" not in result.reason


def test_a_fatal_on_a_rank_that_outlived_the_dead_one_is_not_blamed(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    launch = _launch(tmp_path)
    for rank in (0, 1):
        _write(tmp_path, events.Hello(rank, time.time(), finished.pid))
    launch.watch.poll()
    launch.watch.dead_since[1] = time.monotonic() - 1  # rank 1 was killed first
    _write(tmp_path, events.Fatal(0, time.time(), finished.pid, "run", "RuntimeError: Connection closed by peer"))
    launch.watch.poll()
    outcome = launch._outcome(CASE.case_id, events.Problem.RANK_DIED, None)
    assert isinstance(outcome, Outcome)
    assert outcome.record.error.startswith("rank 1 died during the case")
