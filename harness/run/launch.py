"""Plan groups to torchrun launches: one launch per world size, many cases each.

A case that hangs, raises on one rank, or loses a rank or a node costs only itself: the launcher kills the group
and relaunches it for the cases left. It watches the ranks' event files and their process ids, never a pipe; the
ranks of another node through that node's agent (harness.run.nodes).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness import flows
from harness.core import events
from harness.core.events import Done, Fatal, Hello, Problem, RankError, Result, Start
from harness.core.modes import mode_of
from harness.core.records import Case, CaseRecord, GroupSpec, Outcome
from harness.run import procs, warm
from harness.run.launchers import Capacity, Local, node_env
from harness.run.nodes import SETTLE_S, NodeView, SharedRun
from harness.run.procs import POLL_S
from harness.run.stacks import FATAL, death_stack, rank_stacks, stuck_where, waiting_on_lock
from harness.run.tail import LineTail

# a rank's error, then no result from rank 0 and no CPU time used by any rank: the others are stuck in a collective
RANK_ERROR_GRACE_S = 5.0
STARTUP_TIMEOUT_S = 180.0  # imports, gloo/NCCL init and rendezvous
JOIN_NAG_S = 30.0  # after this long without another node's ranks, the run says which node it waits for
# A hang is a group that stops computing: no rank uses PROGRESS_CPU_S of CPU time in STALL_S. A slow or busy machine
# still gives every runnable rank CPU time, so this does not depend on machine speed; ranks blocked in a collective
# or asleep use none (measured: a hung 2-rank gloo group, 0.01 s in 4 s). `--case-timeout` stays the outer bound
# (on CUDA, NCCL may spin while it waits, so only the timeout catches a hang there).
STALL_S = 20.0
PROGRESS_CPU_S = 0.5


@dataclass
class _Watch:
    """Progress of one launch, read from the ranks' event files."""

    workdir: Path
    world_size: int
    tails: dict[int, LineTail] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    current: str | None = None  # rank 0's case in flight
    started_at: float = field(default_factory=time.monotonic)
    started: dict[int, str] = field(default_factory=dict)  # rank -> the case it began last (one may be ahead of 0)
    rank_errors: dict[str, dict[int, tuple[RankError, float]]] = field(default_factory=dict)  # and when seen
    dead_since: dict[int, float] = field(default_factory=dict)
    progress: tuple[float, float] | None = None  # (CPU seconds of all ranks, when they last grew by PROGRESS_CPU_S)
    ready_at: float | None = None  # when the first rank said hello: imports, init and rendezvous are done
    fatal: dict[int, Fatal] = field(default_factory=dict)  # rank -> its failure outside any case (startup, cleanup)
    finished: set[int] = field(default_factory=set)  # ranks that said they are done: their exit is no death
    nodes: dict[int, int] = field(default_factory=dict)  # rank -> the node it runs on (0: this one)
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> the host name it reported
    view: NodeView | None = None  # the other nodes of a launch that spans several

    def poll(self) -> list[Result]:
        """New result events from every rank; tracks pids, the case in flight and ranks' errors on the way."""
        results = []
        for rank in range(self.world_size):
            tail = self.tails.setdefault(rank, LineTail(self.workdir / f"rank{rank}.jsonl"))
            for line in tail.lines():
                results.extend(self._on(_event(line, tail.path)))
        return results

    def _on(self, event: events.Event) -> list[Result]:
        if isinstance(event, Hello):
            self.pids[event.rank], self.nodes[event.rank], self.hosts[event.rank] = event.pid, event.node, event.host
            self.ready_at = self.ready_at or time.monotonic()
        elif isinstance(event, Start):
            self.started[event.rank] = event.case_id
            if event.rank == 0:
                self.current, self.started_at = event.case_id, time.monotonic()
        elif isinstance(event, RankError):
            self.rank_errors.setdefault(event.case_id, {}).setdefault(event.rank, (event, time.monotonic()))
        elif isinstance(event, Fatal):
            self.fatal.setdefault(event.rank, event)
        elif isinstance(event, Done):
            self.finished.add(event.rank)
        elif isinstance(event, Result):
            self.current = None
            return [event]
        return []

    def dead_ranks(self) -> list[int]:
        """Ranks whose process is gone without reporting an error (killed), the first seen dead first: torchrun
        then stops the others, which must not be blamed; a rank that reported an error and then exited is a
        follower of whoever failed first."""
        now = time.monotonic()
        for rank in self.pids:  # one that finished its cases may exit while rank 0 still judges the last one
            if rank not in self.dead_since and rank not in self.finished and not self._alive(rank):
                self.dead_since[rank] = now
        reported = self.rank_errors.get(self.current, {})
        # one seen gone before its "done" line was read (it writes the line, then exits) finished: found under load
        return sorted((rank for rank in self.dead_since if rank not in reported and rank not in self.finished),
                      key=lambda rank: (self.dead_since[rank], rank))

    def stalled_for(self) -> float:
        """Seconds since the ranks last made progress (used CPU time); 0 where CPU time cannot be read."""
        used = [self._cpu(rank) for rank in self.pids]
        now = time.monotonic()
        if not used or None in used:
            self.progress = None
            return 0.0
        total = sum(used)
        if self.progress is None or total - self.progress[0] >= PROGRESS_CPU_S:
            self.progress = (total, now)
        return now - max(self.progress[1], self.started_at)

    def blocked_for(self) -> float:
        """How long the ranks have used no CPU time (`stalled_for`); where it cannot be read, as long as can be: a
        rank that computes is not stuck behind another's error, however slow a loaded machine makes it."""
        stalled = self.stalled_for()
        return float("inf") if self.progress is None else stalled

    def _alive(self, rank: int) -> bool:
        if not self.nodes.get(rank):
            return procs.alive(self.pids[rank])
        seen = self.view.rank(rank) if self.view else None
        return seen is None or seen.alive  # not reported yet: its agent has not found it yet

    def _cpu(self, rank: int) -> float | None:
        if not self.nodes.get(rank):
            return procs.cpu_seconds(self.pids[rank])
        seen = self.view.rank(rank) if self.view else None
        return seen.cpu if seen else None

    def name(self, rank: int) -> str:
        """`rank 3`, and on a launch over several nodes `rank 3 (node 1, host)`."""
        if self.view is None:
            return f"rank {rank}"
        return f"rank {rank} (node {self.nodes.get(rank, 0)}, {self.hosts.get(rank, '?')})"

    def error_unanswered_for(self) -> float:
        """Seconds since another rank's error of the case in flight with no result from rank 0, counted from the
        later of the error and rank 0's start of the case: a rank ahead of rank 0 (which also judges) may raise in a
        case rank 0 has not begun (found under load: rank 1 raised 5 s before rank 0 reached the case)."""
        first = self.first_error(self.current) if self.current is not None else None
        return 0.0 if first is None else time.monotonic() - max(first[1], self.started_at)

    def first_error(self, case_id: str) -> tuple[RankError, float] | None:
        """The first rank error of the case (by its rank's clock) and when the launcher saw it."""
        errors = self.rank_errors.get(case_id, {})
        return min(errors.values(), key=lambda found: found[0].time) if errors else None


@dataclass
class GroupStats:
    """What running one world size cost: torchrun launches, and their start-ups (imports, init, rendezvous)."""

    launches: int = 0
    startup_s: float = 0.0


@dataclass(frozen=True)
class Nodes:
    """Where a run's groups go: the launcher, how many ranks fit, and node 0's side of a multi-node run."""

    launcher: Local = field(default_factory=Local)
    capacity: Capacity | None = None
    shared: SharedRun | None = None
    forked: bool = False  # the launches on this host fork their ranks from the warm parent (harness.run.warm)

    def nodes_for(self, world_size: int) -> int:
        """How many nodes a group of `world_size` ranks spans (1 on one host; the plan left out what fits none)."""
        if self.shared is None or self.capacity is None:
            return 1
        return self.capacity.nodes_for(world_size) or 1


def run_group(cases: list[Case], group: GroupSpec, workdir: Path, case_timeout: float,
              on_outcome: Callable[[Outcome], None], nodes: Nodes | None = None,
              echo: Callable[[str], None] | None = None) -> GroupStats:
    """Run every case of one world size, relaunching after a hang or crash until each has an outcome; `echo` hears
    when a launch's ranks are up (imports, init and rendezvous take seconds, tens of them on a busy machine). A case
    whose rank died of a native signal runs once more, first in the next launch (a fresh group); its outcome then
    carries that death (`CaseRecord.rank_death`): a second death is its ERROR, as the first would have been."""
    remaining, stats = list(cases), GroupStats()
    deaths: dict[str, CaseRecord] = {}  # case id -> the attempt a rank's native death ended

    def deliver(outcome: Outcome) -> None:
        first = deaths.get(outcome.case.case_id)
        if first is not None:
            outcome = Outcome(outcome.case, replace(outcome.record, rank_death={"error": first.error,
                                                                                "traceback": first.traceback}))
        on_outcome(outcome)

    while remaining:
        stats.launches += 1
        folder = workdir / f"ws{remaining[0].world_size}-{stats.launches}"
        folder.mkdir(parents=True, exist_ok=True)
        spec = replace(group, workdir=str(folder), cases=remaining)
        launch = _Launch(spec, folder, case_timeout, deliver, nodes or Nodes(), echo, deaths)
        done = launch.run()
        stats.startup_s += launch.startup_s
        remaining = [case for case in remaining if case.case_id not in done]
    return stats


class _Launch:
    """One torchrun launch over `cases`; stops at the first case it has to give up on."""

    def __init__(self, group: GroupSpec, folder: Path, case_timeout: float, on_outcome, nodes: Nodes | None = None,
                 echo: Callable[[str], None] | None = None, deaths: dict[str, CaseRecord] | None = None):
        cases = group.cases
        self.deaths = {} if deaths is None else deaths  # the cases a native death ended once (run_group's)
        self.held: set[str] = set()  # a case this launch's death ended for the first time: the next launch reruns it
        self.echo, self.up, self.nagged = echo, False, False
        self.by_id = {case.case_id: case for case in cases}
        self.folder, self.case_timeout, self.on_outcome = folder, case_timeout, on_outcome
        self.world_size = cases[0].world_size
        self.nodes = nodes or Nodes()
        self.watch = _Watch(folder, self.world_size)
        self.stacks: dict[int, str] = {}
        self.lock_said: str | None = None  # the case a wait for a file lock was said of
        self.done: set[str] = set()
        self.log = folder / "torchrun.log"  # the agent's and the ranks' output: torchrun's, or the forked launch's
        (folder / "group.json").write_text(json.dumps(group.to_dict()))

    def run(self) -> set[str]:
        started = self.started = time.monotonic()
        try:
            return self._run()
        finally:
            self.startup_s = (self.watch.ready_at or time.monotonic()) - started

    def _run(self) -> set[str]:
        spans = self.nodes.nodes_for(self.world_size)
        view = self.nodes.shared.request(self.folder, self.world_size, spans) if spans > 1 else None
        self.watch.view = view
        process = (self._forked() if spans == 1 and self.nodes.forked else None) or \
            self._torchrun(spans, view.rdzv_id if view else "")
        try:
            self._watch(process)
        finally:
            procs.kill_tree(process)
            procs.kill_ranks([pid for rank, pid in self.watch.pids.items() if not self.watch.nodes.get(rank)],
                             self.folder)
            if view is not None:
                view.end()  # every other node stops its share; the next launch finds them free
        return self.done

    def _forked(self) -> warm.ForkedLaunch | None:
        """The ranks forked from the warm parent; None (said) when it cannot start them: torchrun then does."""
        started = warm.shared().launch(self.world_size, self.folder / "group.json", self.folder, node_env(0))
        if isinstance(started, warm.ForkedLaunch):
            self.log = self.folder / warm.LOG
            return started
        if self.echo is not None:
            self.echo(f"  starting the ranks with torchrun: {started}")
        return None

    def _torchrun(self, spans: int, rdzv_id: str) -> subprocess.Popen:
        command = self.nodes.launcher.command(self.world_size, spans, self.folder / "group.json", rdzv_id)
        with open(self.log, "w") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=node_env(0),
                                    start_new_session=True)

    def _watch(self, process: subprocess.Popen) -> None:
        while True:
            self._deliver(self.watch.poll())
            self._say_up()
            if len(self.done) == len(self.by_id):
                return
            problem = self._problem(process)
            if problem is None or (problem is Problem.RANK_DIED and self._rank_0_judging()):
                time.sleep(POLL_S)
                continue
            time.sleep(POLL_S)
            problem = self._settled(problem)
            self._deliver(self.watch.poll())  # the last lines written before the problem
            if problem is Problem.RANK_ERROR and self._problem(process) is not Problem.RANK_ERROR:
                continue  # rank 0 reported the case after all: nothing is stuck
            if problem is Problem.RANK_DIED and not self.watch.dead_ranks():
                continue  # the rank said it was done before it exited: rank 0 still judges the last case
            if problem.stuck:
                self.stacks = rank_stacks(self.folder, self.watch)
                if problem is Problem.HUNG and waiting_on_lock(self.stacks):
                    self._waiting_on_lock()
                    continue
            self._blame(problem, process.poll())  # before the kill, which would make every rank look dead
            procs.kill_tree(process)
            return

    def _waiting_on_lock(self) -> None:
        """The ranks wait for a file lock another process holds (another run compiling into the same Inductor
        cache): not a hang. Say so once per case and start the stall clock again; the case timeout bounds it."""
        self.watch.progress = None
        if self.echo is not None and self.lock_said != self.watch.current:
            self.lock_said = self.watch.current
            self.echo(f"  {self.watch.current}: every rank waits for a file lock another process holds (another run "
                      "compiling into the same Inductor cache?); waiting, within the case timeout")

    def _say_up(self) -> None:
        """Once the ranks are up, say so; while another node has not joined after JOIN_NAG_S, say which, once."""
        if self.echo is None or self.up:
            return
        waited = time.monotonic() - self.started
        if len(self.watch.pids) == self.world_size:
            self.up = True
            self.echo(f"  {self.world_size} rank(s) up after {waited:.0f}s")
        elif self.watch.view is not None and waited > JOIN_NAG_S and not self.nagged:
            self.nagged = True
            missing = ", ".join(map(str, self.watch.view.missing())) or "?"
            self.echo(f"  waiting for node(s) {missing} to join ({waited:.0f}s): is `harness run --node-rank N` "
                      "running there, with the same --report-dir on a filesystem every node shares?")

    def _settled(self, problem: Problem) -> Problem:
        """Over several nodes, a node's failure reaches node 0's ranks (and its torchrun) before that node's status
        file does: wait for the file before blaming a rank for what its agent did."""
        view = self.watch.view
        if view is None or problem.stuck:
            return problem
        time.sleep(SETTLE_S)
        view.refresh()
        return Problem.AGENT_LOST if view.lost_agents() else problem

    def _deliver(self, results: list[Result]) -> None:
        dead = self.watch.dead_ranks()
        for result in results:
            record = result.record
            if record.error and dead:  # rank 0's "connection closed" is a symptom: name the rank that died
                record = self._died(record.case_id, dead[0], f"; rank 0 saw: {record.error}")
            self._give(Outcome(self.by_id[record.case_id], record))

    def _give(self, outcome: Outcome) -> None:
        """The case's outcome to the run; the first native death of a case (its rank's faulthandler wrote a fatal
        signal's stack: SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) is held back instead and said, and the case left
        for the next launch, a fresh group, to run once more. A SIGKILL or an exit is no native death: not rerun."""
        case_id, record = outcome.case.case_id, outcome.record
        if record.traceback.startswith(FATAL) and case_id not in self.deaths:
            self.deaths[case_id] = record
            self.held.add(case_id)
            if self.echo is not None:
                self.echo(f"  {case_id}: {record.error}; running it once more in a fresh group")
            return
        self.done.add(case_id)
        self.on_outcome(outcome)

    def _problem(self, process) -> Problem | None:
        watch = self.watch
        waited = time.monotonic() - watch.started_at
        if watch.view is not None:
            watch.view.refresh()
            if watch.view.lost_agents():
                return Problem.AGENT_LOST
            if watch.view.silent():
                return Problem.NODE_SILENT
        if watch.dead_ranks():
            return Problem.RANK_DIED
        if process.poll() is not None:
            return Problem.EXITED
        if watch.current is None:
            return Problem.STARTUP if not watch.pids and waited > STARTUP_TIMEOUT_S else None
        if watch.error_unanswered_for() > RANK_ERROR_GRACE_S and watch.blocked_for() > RANK_ERROR_GRACE_S:
            return Problem.RANK_ERROR
        if watch.stalled_for() > STALL_S:
            return Problem.HUNG
        return Problem.TIMEOUT if waited > self._limit(watch.current) else None

    def _limit(self, case_id: str | None) -> float:
        """The case timeout, times its mode's factor (or that of the mode its flow compiles in): compiling is most
        of a compiled case's time."""
        case = self.by_id.get(case_id)
        if case is None:
            return self.case_timeout
        return self.case_timeout * mode_of(flows.compiling_mode(case)).timeout_factor

    def _blame(self, problem: Problem, returncode) -> None:
        """Give the case in flight its outcome; if the launch died before any case started, every case."""
        current = self._in_flight(problem)
        victims = [current] if current else ([] if self.done or self.held else
                                             [cid for cid in self.by_id if cid not in self.done])
        for case_id in victims:
            self._give(self._outcome(case_id, problem, returncode))

    def _rank_0_judging(self) -> bool:
        """A rank died in a later case than rank 0's in flight: every collective of rank 0's case is behind both, so
        rank 0 only judges it; its result is waited for (within the case timeout) before the group is stopped."""
        dead, current, order = self.watch.dead_ranks(), self.watch.current, list(self.by_id)
        began = self.watch.started.get(dead[0]) if dead else None
        return current in self.by_id and began in self.by_id and 0 not in dead and \
            order.index(began) > order.index(current) and \
            time.monotonic() - self.watch.started_at < self._limit(current)

    def _in_flight(self, problem: Problem) -> str | None:
        """The case the problem ends: rank 0's in flight, or for a rank that died the case that rank had begun: the
        other ranks go on to the next case while rank 0 still judges the last (found under load: rank 1 aborted in
        the next case, and the case rank 0 was judging was blamed for it); the case rank 0 was in then runs again in
        the next launch."""
        dead = self.watch.dead_ranks() if problem is Problem.RANK_DIED else []
        for case_id in (self.watch.started.get(dead[0]) if dead else None, self.watch.current):
            if case_id in self.by_id and case_id not in self.done and case_id not in self.held:
                return case_id
        return None

    def _outcome(self, case_id: str, problem: Problem, returncode) -> Outcome:
        case, waited = self.by_id[case_id], time.monotonic() - self.watch.started_at
        return Outcome(case, self._record(case_id, problem, returncode, waited))

    def _record(self, case_id: str, problem: Problem, returncode, waited: float) -> CaseRecord:
        first, dead, name = self.watch.first_error(case_id), self.watch.dead_ranks(), self.watch.name
        error = first[0] if first else None
        if problem in (Problem.AGENT_LOST, Problem.NODE_SILENT):
            lost, node = self._node_lost(problem)
            return CaseRecord(case_id, error=lost, traceback=_last_log_lines(self.folder / f"torchrun-node{node}.log"))
        fatal = min(self.watch.fatal.values(), key=lambda event: event.time) if self.watch.fatal else None
        if fatal is not None and (not dead or dead[0] == fatal.rank or fatal.stage == "startup"):
            # the rank's own traceback (an import, init or cleanup failure), not torchrun's summary of it; a
            # fatal on a rank that outlived the first dead one is a symptom, named below
            return CaseRecord(case_id, error=f"failed at {fatal.stage}: {fatal.message}", error_rank=fatal.rank,
                              traceback=fatal.traceback)
        if dead:  # the others' errors ("connection closed") are symptoms: name the rank that died, and where
            seen = f"; rank {error.rank} saw: {error.message}" if error and error.rank != dead[0] else ""
            return self._died(case_id, dead[0], seen)
        if error is not None:
            return CaseRecord(case_id, error=error.message, error_rank=error.rank, traceback=error.traceback)
        where, stacks = stuck_where(self.stacks, name), "\n".join(f"--- {name(rank)} ---\n{text}"
                                                                   for rank, text in sorted(self.stacks.items()))
        if problem is Problem.TIMEOUT:
            return CaseRecord(case_id, error=f"no result after {waited:.0f}s (case timeout "
                                             f"{self._limit(case_id):.0f}s){where}", timeout=True,
                              traceback=stacks)
        if problem is Problem.HUNG:
            return CaseRecord(case_id, error=f"hung: no rank used CPU time for {STALL_S:.0f}s (blocked or asleep), "
                                             f"{waited:.0f}s into the case{where}", timeout=True, traceback=stacks)
        missing = self.watch.view.missing() if self.watch.view else []
        joined = f"; node(s) {', '.join(map(str, missing))} never joined the launch (is `harness run --node-rank N` " \
                 "running there, with the same --report-dir on a shared filesystem?)" if missing else ""
        return CaseRecord(case_id, error=f"worker group ({problem}, exit code {returncode}) before reporting"
                                         f"{joined}: {_last_log_lines(self.log)}")

    def _died(self, case_id: str, rank: int, seen: str) -> CaseRecord:
        """The case's ERROR for a rank that died: which, its pid, where (the stack its faulthandler wrote as a fatal
        signal ended it, its traceback; else the launch log's last lines), and what another rank saw (`seen`)."""
        death = death_stack(self.folder, rank)
        how = f": {death[0]}" if death else ""
        return CaseRecord(case_id, error=f"{self.watch.name(rank)} died during the case (pid {self.watch.pids[rank]})"
                                         f"{how}{seen}", traceback=death[1] if death else _last_log_lines(self.log))

    def _node_lost(self, problem: Problem) -> tuple[str, int]:
        """A whole node failed: its torchrun agent died while its ranks ran, or its harness agent went silent."""
        view = self.watch.view
        node = min(view.lost_agents() or view.silent())
        ranks = ", ".join(str(rank) for rank, where in sorted(self.watch.nodes.items()) if where == node)
        on_it = f"; its ranks {ranks} were stopped" if ranks else ""
        if problem is Problem.AGENT_LOST:
            code = view.status[node].agent_exit
            how = f"signal {-code}" if isinstance(code, int) and code < 0 else f"exit code {code}"
            return f"node {node} ({view.host(node)}): its torchrun agent died ({how}) during the case{on_it}", node
        return (f"node {node} ({view.host(node)}) stopped reporting for {view.quiet[node]:.0f}s during the case (its "
                f"harness agent or the node itself is gone){on_it}", node)


def _event(line: str, path: Path) -> events.Event:
    """A whole line of a rank's event file, typed; anything else is a bug of the harness, said with its file."""
    try:
        return events.from_dict(json.loads(line))
    except (ValueError, KeyError, TypeError) as error:
        raise RuntimeError(f"{path}: not an event line ({error}): {line[:200]!r}") from None


def _last_log_lines(path: Path, lines: int = 6) -> str:
    """The last non-blank lines of a launch's log, joined on one line: what the agent said of a case it took down."""
    try:
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def group_by_world_size(cases: Iterable[Case]) -> dict[int, list[Case]]:
    groups: dict[int, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.world_size, []).append(case)
    return dict(sorted(groups.items()))
