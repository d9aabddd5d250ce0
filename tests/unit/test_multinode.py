"""A run over several nodes, two "nodes" on loopback: two torchrun agents joined by a c10d rendezvous on 127.0.0.1,
two ranks each. Node 0 plans and judges in this process; node 1 is `harness run --node-rank 1` in a subprocess that
shares the report folder, as two hosts share a filesystem.

One run holds the clean cases and both faults, so the relaunches are paid once; about 90 s on 2 busy cores.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest

from harness.core.layouts import parse_layout
from harness.core.results import Status
from harness.run import runner
from harness.run.plan import Case, PlannedCase
from tests.processes import kill_leftovers, workers_naming

CLEAN = [Case("flux", parse_layout("ring2xulysses2"), "_native_flash", "fp32"),
         Case("flux", parse_layout("tp4"), "native", "fp32")]
HANG = Case("flux", parse_layout("tp4"), "native", "fp32", fault="hang_node1")
KILL = Case("flux", parse_layout("ring2xulysses2"), "_native_flash", "fp32", fault="kill_agent_node1")
CASE_TIMEOUT = 120  # far beyond a clean case here; the hang is found by the stall detection or this, either TIMEOUT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node1(project, references, port: int) -> subprocess.Popen:
    args = ["run", "--references", str(references), "--launcher", "torchrun", "--nnodes", "2", "--node-rank", "1",
            "--rdzv-endpoint", f"127.0.0.1:{port}"]
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_nodes_match_one_host_and_name_a_hung_rank_and_a_lost_agent(project, zoo_references, settings_for):
    single = runner.run(settings_for(case_timeout=CASE_TIMEOUT), [PlannedCase(c) for c in CLEAN], echo=print)
    port = _free_port()
    node1 = _node1(project, zoo_references, port)
    try:
        settings = settings_for(case_timeout=CASE_TIMEOUT, launcher="torchrun", nnodes=2, node_rank=0,
                                rdzv_endpoint=f"127.0.0.1:{port}")
        two = runner.run(settings, [PlannedCase(c) for c in [*CLEAN, HANG, KILL]], echo=print)
        said, _ = node1.communicate(timeout=900)
        assert workers_naming(project) == [], "a torchrun or rank process outlived the run on one of the nodes"
    finally:
        node1.kill()
        kill_leftovers(project)
    assert node1.returncode == 0, said
    assert re.search(r"node 1: run \w+ is over", said), said

    one_host = {r.case_id: r for r in single.results}
    nodes = {r.case_id: r for r in two.results}
    for case in CLEAN:  # the same statuses and the same numbers: the layout does not care where its ranks live
        mine, theirs = nodes[case.case_id], one_host[case.case_id]
        assert (mine.status, theirs.status) == (Status.PASS, Status.PASS), (mine.reason, theirs.reason)
        assert mine.figures == theirs.figures

    hung = nodes[HANG.case_id]
    assert hung.status is Status.TIMEOUT, hung.reason
    assert re.search(r"stuck: .*rank (\d) \(node 1, [^)]+\) in _sleep_forever \(reliability\.py:\d+\)", hung.reason), \
        hung.reason
    stacks = hung.extra["traceback"]  # node 1's ranks dumped theirs when node 0 asked, through the shared folder
    assert re.search(r"--- rank \d \(node 1, [^)]+\) ---\n.*_sleep_forever", stacks, re.S), stacks[:2000]
    assert stacks.count("--- rank") == 4

    lost = nodes[KILL.case_id]
    assert lost.status is Status.ERROR
    assert re.fullmatch(r"node 1 \([^)]+\): its torchrun agent died \(signal 9\) during the case; its ranks \d, \d "
                        r"were stopped", lost.reason), lost.reason
    assert two.header.launches == 2  # the hang ended the first launch; the kill the second


def test_another_node_follows_only_a_run_whose_judge_beats_and_stops_with_it(tmp_path, monkeypatch):
    """A run killed outright leaves its last beat behind: another node must not join that run, and must end when a
    live run ends."""
    import json
    import threading

    from harness.run import nodes
    from harness.run.launchers import Torchrun

    monkeypatch.setattr(nodes, "JOIN_WAIT_S", 3.0)
    (tmp_path / "judge.beat").write_text(json.dumps({"run_id": "killed", "beat": 7}))
    said: list[str] = []
    agent = nodes.NodeAgent(tmp_path, Torchrun(2, 1, "127.0.0.1:1"), echo=said.append)
    assert agent.run() == 1
    assert said[0].startswith(f"node 1: waiting for node 0's run in {tmp_path} (0s of at most 3s;")  # said at once
    assert said[-1] == (f"node 1: no run from node 0 in {tmp_path} after 3s (is node 0 running `harness run` with "
                        "the same --report-dir on a filesystem both nodes share?)") and len(said) == 2

    codes: list[int] = []
    said.clear()
    with nodes.SharedRun(tmp_path, 2) as shared:
        follower = threading.Thread(target=lambda: codes.append(agent.run()))
        follower.start()
        while not any("following" in line for line in said):
            assert follower.is_alive(), said
            threading.Event().wait(0.1)
    follower.join(timeout=10)
    assert codes == [0]
    assert said[0].startswith("node 1: waiting for node 0's run")  # then it finds the run that beats
    assert said[1:] == [f"node 1: following run {shared.run_id} in {tmp_path}", f"node 1: run {shared.run_id} is over"]
