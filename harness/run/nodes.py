"""Several nodes, one judge: the files through which node 0 (which plans, launches and judges) and the agents of
nodes 1..N-1 (which only run ranks) work together. They live in the run's work files (`<report_dir>.work/launches`,
harness.run.folders), which must be on a filesystem every node shares at the same path, like the references.

    run.json, judge.beat, run.ended     node 0: the run exists, is alive (a counter, every second), is over
    <launch>/launch.json                node 0: start your share of this launch (nodes, ranks, rendezvous id)
    <launch>/node<K>.json               node K's agent, every STATUS_S: its ranks alive or not and their CPU time,
                                        its torchrun's exit (and whether it died before its ranks did)
    <launch>/stacks.request             node 0: every node, make your ranks dump their stacks (a hang)
    <launch>/ended, <launch>/node<K>.ended   node 0: stop this launch; node K: done, nothing of it is left here

Every liveness fact is a counter that changes, timed on the reader's own clock, so no two nodes' clocks are
compared. The ranks' own event and stack files go to the launch folder as on one host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.core import events
from harness.core.events import EventType
from harness.run import procs
from harness.run.launchers import node_env
from harness.run.procs import POLL_S
from harness.run.tail import LineTail

STATUS_S = 0.5  # how often a node's agent writes its status
SETTLE_S = 2 * STATUS_S  # node 0 waits this long for the other nodes' word before it blames a rank
NODE_SILENT_S = 15.0  # a node whose status stops changing this long is gone (its agent died, or the node did)
JUDGE_SILENT_S = 30.0  # a run whose judge stops beating this long is over for the other nodes
JOIN_WAIT_S = 900.0  # how long another node waits for node 0 to start a run (planning and capture come first)
ACK_WAIT_S = 20.0  # how long node 0 waits for every node to say a launch is gone from it


@dataclass(frozen=True)
class LaunchRequest:
    """`<launch>/launch.json`: node 0 asks nodes 1..nodes-1 to start their share of a launch."""

    run_id: str
    seq: int
    nodes: int
    world_size: int
    rdzv_id: str


@dataclass(frozen=True)
class RankSeen:
    alive: bool
    cpu: float | None
    pid: int


@dataclass(frozen=True)
class NodeStatus:
    """`<launch>/node<K>.json`: what node K's agent last saw of its ranks and its torchrun (`beat` counts up)."""

    beat: int
    host: str
    agent_pid: int
    ranks: dict[str, RankSeen]
    agent_exit: int | None = None
    agent_first: bool = False  # its torchrun died while its ranks still ran

    @classmethod
    def from_dict(cls, data: dict) -> NodeStatus:
        ranks = {rank: RankSeen(**seen) for rank, seen in data.get("ranks", {}).items()}
        return cls(data["beat"], data.get("host", "?"), data.get("agent_pid", 0), ranks, data.get("agent_exit"),
                   data.get("agent_first", False))


def _write(path: Path, data) -> None:
    """Atomically, so a reader on another node never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class _Changes:
    """When a file's content last changed, on this process's clock."""

    def __init__(self):
        self.seen: dict[Path, tuple[object, float]] = {}

    def quiet_for(self, path: Path, content) -> float:
        now = time.monotonic()
        last = self.seen.get(path)
        if last is None or last[0] != content:
            self.seen[path] = (content, now)
            return 0.0
        return now - last[1]


class SharedRun:
    """Node 0's side of a multi-node run: says the run exists, beats every second while it lives, and says when it
    is over, interrupted ones included (each node's agent then stops its own ranks and exits)."""

    def __init__(self, workdir: Path, nnodes: int):
        self.workdir, self.nnodes, self.launches = Path(workdir), nnodes, 0
        self.run_id = uuid.uuid4().hex[:12]
        self._stop = threading.Event()

    def __enter__(self) -> SharedRun:
        self.workdir.mkdir(parents=True, exist_ok=True)
        _write(self.workdir / "run.json", {"run_id": self.run_id, "nnodes": self.nnodes})
        threading.Thread(target=self._beat, name="judge-beat", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        _write(self.workdir / "run.ended", {"run_id": self.run_id, "interrupted": exc[0] is not None})

    def _beat(self) -> None:
        count = 0
        while not self._stop.is_set():
            count += 1
            _write(self.workdir / "judge.beat", {"run_id": self.run_id, "beat": count})
            self._stop.wait(1.0)

    def request(self, folder: Path, world_size: int, nodes: int) -> NodeView:
        """Ask nodes 1..nodes-1 to start their share of the launch in `folder`; the view watches them."""
        self.launches += 1
        rdzv_id = f"{self.run_id}-{self.launches}"
        _write(folder / "launch.json", asdict(LaunchRequest(self.run_id, self.launches, nodes, world_size, rdzv_id)))
        return NodeView(folder, nodes, rdzv_id)


@dataclass
class NodeView:
    """Node 0's view of the other nodes of one launch, from their status files."""

    folder: Path
    nodes: int
    rdzv_id: str
    status: dict[int, NodeStatus] = field(default_factory=dict)
    changes: _Changes = field(default_factory=_Changes)
    quiet: dict[int, float] = field(default_factory=dict)

    def refresh(self) -> None:
        for node in range(1, self.nodes):
            path = self.folder / f"node{node}.json"
            found = _read(path)
            if found is not None:
                self.status[node] = NodeStatus.from_dict(found)
                self.quiet[node] = self.changes.quiet_for(path, found.get("beat"))

    def rank(self, rank: int) -> RankSeen | None:
        """A rank on another node as its agent last saw it (None: not reported yet)."""
        for status in self.status.values():
            found = status.ranks.get(str(rank))
            if found is not None:
                return found
        return None

    def silent(self) -> list[int]:
        """Nodes that reported once and then stopped: their agent, or the node itself, is gone."""
        return [node for node, quiet in sorted(self.quiet.items()) if quiet > NODE_SILENT_S]

    def missing(self) -> list[int]:
        return [node for node in range(1, self.nodes) if node not in self.status]

    def lost_agents(self) -> dict[int, NodeStatus]:
        """Nodes whose torchrun died while its ranks still ran (killed, or crashed): the agent, not a rank, failed."""
        return {node: status for node, status in self.status.items() if status.agent_first}

    def host(self, node: int) -> str:
        return self.status[node].host if node in self.status else "?"

    def ask_stacks(self) -> None:
        _write(self.folder / "stacks.request", {"at": time.time()})

    def end(self) -> list[int]:
        """Tell every node the launch is over and wait until each says nothing of it is left there; the nodes that
        did not answer in ACK_WAIT_S (gone, or never joined)."""
        _write(self.folder / "ended", {"at": time.time()})
        deadline = time.monotonic() + ACK_WAIT_S
        waiting = [node for node in range(1, self.nodes) if node in self.status]
        while waiting and time.monotonic() < deadline:
            waiting = [node for node in waiting if not (self.folder / f"node{node}.ended").exists()]
            time.sleep(POLL_S)
        return waiting


class NodeAgent:
    """Node K's agent (K > 0): follows node 0's run, starts its share of each launch, reports on its ranks, makes
    them dump their stacks when asked, and stops them when a launch or the run ends, or node 0 goes silent."""

    def __init__(self, workdir: Path, launcher, echo=print):
        self.workdir, self.launcher, self.echo = Path(workdir), launcher, echo
        self.node = launcher.node_rank
        self.changes = _Changes()
        self.run_id: str | None = None
        self.done: set[str] = set()  # launch folders handled

    def run(self) -> int:
        self.run_id = self._wait_for_run()
        if self.run_id is None:
            self.echo(f"node {self.node}: no run from node 0 in {self.workdir} after {JOIN_WAIT_S:.0f}s (is node 0 "
                      "running `harness run` with the same --report-dir on a filesystem both nodes share?)")
            return 1
        self.echo(f"node {self.node}: following run {self.run_id} in {self.workdir}")
        while True:
            ended = _read(self.workdir / "run.ended")
            if ended and ended.get("run_id") == self.run_id:
                self.echo(f"node {self.node}: run {self.run_id} is over")
                return 0
            if self._judge_quiet() > JUDGE_SILENT_S:
                self.echo(f"node {self.node}: node 0 stopped beating for {JUDGE_SILENT_S:.0f}s; stopping")
                return 1
            launch = self._next_launch()
            if launch is None:
                time.sleep(POLL_S)
                continue
            self._follow(launch)

    def _judge_quiet(self) -> float:
        beat = _read(self.workdir / "judge.beat")
        return self.changes.quiet_for(self.workdir / "judge.beat", beat)

    def _wait_for_run(self) -> str | None:
        """The id of a run whose judge beats (a stale run.json left by a killed run does not); says at once what it
        waits for, and again every minute."""
        deadline, first, said = time.monotonic() + JOIN_WAIT_S, None, 0.0
        while time.monotonic() < deadline:
            if time.monotonic() - said >= 60:
                waited = JOIN_WAIT_S - (deadline - time.monotonic())
                self.echo(f"node {self.node}: waiting for node 0's run in {self.workdir} ({waited:.0f}s of at most "
                          f"{JOIN_WAIT_S:.0f}s; node 0's --report-dir must be this folder, on a filesystem both "
                          "nodes share)")
                said = time.monotonic()
            beat = _read(self.workdir / "judge.beat")
            if beat is not None and first is not None and beat != first and beat.get("run_id"):
                ended = _read(self.workdir / "run.ended")
                if not (ended and ended.get("run_id") == beat["run_id"]):
                    return beat["run_id"]
            first = first if first is not None and beat == first else beat
            time.sleep(POLL_S)
        return None

    def _next_launch(self) -> Path | None:
        requests = []
        for path in _launch_files(self.workdir):
            found = _read(path)
            request = LaunchRequest(**found) if found else None
            if (request and request.run_id == self.run_id and request.nodes > self.node
                    and path.parent.name not in self.done and not (path.parent / "ended").exists()):
                requests.append((request.seq, path.parent))
        return min(requests)[1] if requests else None

    def _follow(self, folder: Path) -> None:
        """One launch: start this node's torchrun, report until node 0 ends the launch, then leave nothing."""
        self.done.add(folder.name)
        request = LaunchRequest(**_read(folder / "launch.json"))
        command = self.launcher.command(request.world_size, request.nodes, folder / "group.json", request.rdzv_id)
        with open(folder / f"torchrun-node{self.node}.log", "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=node_env(self.node),
                                       start_new_session=True, preexec_fn=procs.die_with_parent())
            reporter = _Reporter(folder, self.node, request, process)
            try:
                reporter.until_ended(self._judge_quiet)
            finally:
                reporter.stop()
                _write(folder / f"node{self.node}.ended", {"at": time.time()})


class _Reporter:
    """This node's status file for one launch, and what node 0 asks of it."""

    def __init__(self, folder: Path, node: int, request: LaunchRequest, process: subprocess.Popen):
        self.folder, self.node, self.world_size, self.process = folder, node, request.world_size, process
        self.local_ranks = request.world_size // request.nodes
        self.pids: dict[int, int] = {}
        self.tails: dict[int, LineTail] = {}
        self.agent_exit: int | None = None
        self.agent_first = False
        self.stacks_seen = None
        self.beat = 0

    def until_ended(self, judge_quiet) -> None:
        last = 0.0
        while not (self.folder / "ended").exists() and judge_quiet() <= JUDGE_SILENT_S:
            self._find_ranks()
            if self.agent_exit is None and self.process.poll() is not None:
                self.agent_exit = self.process.returncode
                self.agent_first = bool(self.pids) and all(procs.alive(pid) for pid in self.pids.values())
                self._write()  # said before its ranks are stopped, so node 0 blames the agent, not them
                self.stop()
                self._write()
            request = _read(self.folder / "stacks.request")
            if request is not None and request != self.stacks_seen:
                self.stacks_seen = request
                procs.ask_stacks(self.pids.values())
            if time.monotonic() - last >= STATUS_S:
                self._write()
                last = time.monotonic()
            time.sleep(POLL_S)

    def stop(self) -> None:
        """This node's torchrun and every rank it started, even those it left behind when it was killed."""
        procs.kill_tree(self.process)
        procs.kill_ranks(self.pids.values(), self.folder)

    def _find_ranks(self) -> None:
        """This node's ranks, from their hello events (rank, pid, node) in the shared launch folder, read as streams."""
        if len(self.pids) >= self.local_ranks:
            return
        for rank in range(self.world_size):
            if rank in self.pids:
                continue
            tail = self.tails.setdefault(rank, LineTail(self.folder / f"rank{rank}.jsonl"))
            for line in tail.lines():
                data = _json(line)
                if data and data.get("event") == EventType.HELLO:
                    hello = events.from_dict(data)
                    if hello.node == self.node:
                        self.pids[rank] = hello.pid

    def _write(self) -> None:
        self.beat += 1
        ranks = {str(rank): RankSeen(procs.alive(pid), procs.cpu_seconds(pid), pid) for rank, pid in self.pids.items()}
        status = NodeStatus(self.beat, socket.gethostname(), os.getpid(), ranks, self.agent_exit, self.agent_first)
        _write(self.folder / f"node{self.node}.json", asdict(status))


def _launch_files(workdir: Path) -> list[Path]:
    """Every launch folder's request; a folder removed while it is listed is left out."""
    try:
        folders = list(workdir.iterdir())
    except OSError:
        return []
    return [folder / "launch.json" for folder in folders if (folder / "launch.json").exists()]


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None
