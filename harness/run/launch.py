"""Plan groups to torchrun launches: one launch per world size, many cases each.

A case that hangs, raises on one rank, or loses a rank costs only itself: the launcher kills the group and
relaunches it for the cases left. It watches the ranks' event files and their process ids, never a pipe.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.core.records import Case, CaseRecord, GroupSpec, Outcome

POLL_S = 0.1
RANK_ERROR_GRACE_S = 5.0  # a rank's error, then no result: the other ranks are stuck in a collective
STARTUP_TIMEOUT_S = 180.0  # imports, gloo/NCCL init and rendezvous
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
    offsets: dict[int, int] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    current: str | None = None
    started_at: float = field(default_factory=time.monotonic)
    rank_errors: dict[str, dict] = field(default_factory=dict)
    dead_since: dict[int, float] = field(default_factory=dict)
    progress: tuple[float, float] | None = None  # (CPU seconds of all ranks, when they last grew by PROGRESS_CPU_S)
    ready_at: float | None = None  # when the first rank said hello: imports, init and rendezvous are done
    fatal: dict[int, dict] = field(default_factory=dict)  # rank -> its failure outside any case (startup, cleanup)

    def poll(self) -> list[dict]:
        """New result events from every rank; tracks pids, the case in flight and ranks' errors on the way."""
        results = []
        for rank in range(self.world_size):
            path = self.workdir / f"rank{rank}.jsonl"
            if not path.exists():
                continue
            with open(path, "rb") as handle:
                handle.seek(self.offsets.get(rank, 0))
                chunk = handle.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[rank] = self.offsets.get(rank, 0) + len(complete)
            for line in complete.decode().splitlines():
                results.extend(self._on(json.loads(line)))
        return results

    def _on(self, event: dict) -> list[dict]:
        kind, case_id = event["event"], event.get("case_id")
        if kind == "hello":
            self.pids[event["rank"]] = event["pid"]
            self.ready_at = self.ready_at or time.monotonic()
        elif kind == "start" and event["rank"] == 0:
            self.current, self.started_at = case_id, time.monotonic()
        elif kind == "rank_error":
            self.rank_errors.setdefault(case_id, {}).setdefault(event["rank"], {**event, "seen": time.monotonic()})
        elif kind == "fatal":
            self.fatal.setdefault(event["rank"], event)
        elif kind == "result":
            self.current = None
            return [event]
        return []

    def dead_ranks(self) -> list[int]:
        """Ranks whose process is gone without reporting an error (killed), the first seen dead first: torchrun
        then stops the others, which must not be blamed; a rank that reported an error and then exited is a
        follower of whoever failed first."""
        now = time.monotonic()
        for rank, pid in self.pids.items():
            if rank not in self.dead_since and not _alive(pid):
                self.dead_since[rank] = now
        reported = self.rank_errors.get(self.current, {})
        return sorted((rank for rank in self.dead_since if rank not in reported),
                      key=lambda rank: (self.dead_since[rank], rank))

    def stalled_for(self) -> float:
        """Seconds since the ranks last made progress (used CPU time); 0 where CPU time cannot be read."""
        used = [_cpu_seconds(pid) for pid in self.pids.values()]
        now = time.monotonic()
        if not used or None in used:
            self.progress = None
            return 0.0
        total = sum(used)
        if self.progress is None or total - self.progress[0] >= PROGRESS_CPU_S:
            self.progress = (total, now)
        return now - max(self.progress[1], self.started_at)

    def first_error(self, case_id: str) -> dict | None:
        errors = self.rank_errors.get(case_id, {})
        return min(errors.values(), key=lambda event: event["time"]) if errors else None


def _alive(pid: int) -> bool:
    """True for a running process; a zombie (killed, not yet reaped by torchrun) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def launch_command(world_size: int, group_file: Path) -> list[str]:
    # torchrun checks its ranks every --monitor-interval and then stops the survivors; at its 0.1 s default it can
    # stop them before the launcher (every POLL_S) has seen which rank died first, and the wrong rank gets blamed.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            "--monitor-interval=1", "-m", "harness.rank.worker", str(group_file)]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # One thread per rank: ranks share the machine's cores (and torchrun prints a banner when this is unset).
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("DIFFUSERS_VERBOSITY", "error")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def kill_tree(process: subprocess.Popen) -> None:
    """torchrun and its ranks share one session: signal them all, then wait, so no orphan survives."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=5)
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(process.pid, signal.SIGKILL)  # ranks may outlive a torchrun that already exited
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class GroupStats:
    """What running one world size cost: torchrun launches, and their start-ups (imports, init, rendezvous)."""

    launches: int = 0
    startup_s: float = 0.0


def run_group(cases: list[Case], group: GroupSpec, workdir: Path, case_timeout: float,
              on_outcome: Callable[[Outcome], None]) -> GroupStats:
    """Run every case of one world size, relaunching after a hang or crash until each has an outcome."""
    remaining, stats = list(cases), GroupStats()
    while remaining:
        stats.launches += 1
        folder = workdir / f"ws{remaining[0].world_size}-{stats.launches}"
        folder.mkdir(parents=True, exist_ok=True)
        spec = replace(group, workdir=str(folder), cases=remaining)
        launch = _Launch(spec, folder, case_timeout, on_outcome)
        done = launch.run()
        stats.startup_s += launch.startup_s
        remaining = [case for case in remaining if case.case_id not in done]
    return stats


class _Launch:
    """One torchrun launch over `cases`; stops at the first case it has to give up on."""

    def __init__(self, group: GroupSpec, folder: Path, case_timeout: float, on_outcome):
        cases = group.cases
        self.by_id = {case.case_id: case for case in cases}
        self.folder, self.case_timeout, self.on_outcome = folder, case_timeout, on_outcome
        self.world_size = cases[0].world_size
        self.watch = _Watch(folder, self.world_size)
        self.stacks: dict[int, str] = {}
        self.done: set[str] = set()
        (folder / "group.json").write_text(json.dumps(group.to_dict()))

    def run(self) -> set[str]:
        started = time.monotonic()
        try:
            return self._run()
        finally:
            self.startup_s = (self.watch.ready_at or time.monotonic()) - started

    def _run(self) -> set[str]:
        with open(self.folder / "torchrun.log", "w") as log:
            process = subprocess.Popen(launch_command(self.world_size, self.folder / "group.json"), stdout=log,
                                       stderr=subprocess.STDOUT, env=worker_env(), start_new_session=True)
            try:
                self._watch(process)
            finally:
                kill_tree(process)
        return self.done

    def _watch(self, process: subprocess.Popen) -> None:
        while True:
            self._deliver(self.watch.poll())
            if len(self.done) == len(self.by_id):
                return
            problem = self._problem(process)
            if problem is None:
                time.sleep(POLL_S)
                continue
            time.sleep(POLL_S)
            self._deliver(self.watch.poll())  # the last lines written before the problem
            if problem in ("hung", "timeout"):
                self.stacks = rank_stacks(self.folder, self.watch.pids)
            self._blame(problem, process.poll())  # before the kill, which would make every rank look dead
            kill_tree(process)
            return

    def _deliver(self, events: list[dict]) -> None:
        dead = self.watch.dead_ranks()
        for event in events:
            if event.get("error") and dead:  # rank 0's "connection closed" is a symptom: name the rank that died
                event = {**event, "error": f"rank {dead[0]} died during the case; rank 0 saw: {event['error']}",
                         "error_rank": None}
            self.done.add(event["case_id"])
            self.on_outcome(Outcome(self.by_id[event["case_id"]], CaseRecord.from_dict(event)))

    def _problem(self, process) -> str | None:
        watch = self.watch
        waited = time.monotonic() - watch.started_at
        if watch.dead_ranks():
            return "rank_died"
        if process.poll() is not None:
            return "exited"
        if watch.current is None:
            return "startup" if not watch.pids and waited > STARTUP_TIMEOUT_S else None
        first = watch.first_error(watch.current)
        if first is not None and time.monotonic() - first["seen"] > RANK_ERROR_GRACE_S:
            return "rank_error"
        if watch.stalled_for() > STALL_S:
            return "hung"
        return "timeout" if waited > self.case_timeout else None

    def _blame(self, problem: str, returncode) -> None:
        """Give the case in flight its outcome; if the launch died before any case started, every case."""
        current = self.watch.current if self.watch.current in self.by_id else None
        victims = [current] if current else ([] if self.done else [cid for cid in self.by_id if cid not in self.done])
        for case_id in victims:
            self.done.add(case_id)
            self.on_outcome(self._outcome(case_id, problem, returncode))

    def _outcome(self, case_id: str, problem: str, returncode) -> Outcome:
        case, waited = self.by_id[case_id], time.monotonic() - self.watch.started_at
        return Outcome(case, self._record(case_id, problem, returncode, waited))

    def _record(self, case_id: str, problem: str, returncode, waited: float) -> CaseRecord:
        error, dead = self.watch.first_error(case_id), self.watch.dead_ranks()
        fatal = min(self.watch.fatal.values(), key=lambda event: event["time"]) if self.watch.fatal else None
        if fatal is not None and (not dead or dead[0] == fatal["rank"] or fatal["stage"] == "startup"):
            # the rank's own traceback (an import, init or cleanup failure), not torchrun's summary of it; a
            # fatal on a rank that outlived the first dead one is a symptom, named below
            return CaseRecord(case_id, error=f"failed at {fatal['stage']}: {fatal['message']}",
                              error_rank=fatal["rank"], traceback=fatal.get("traceback", ""))
        if dead:  # the others' errors ("connection closed") are symptoms: name the rank that died
            seen = f"; rank {error['rank']} saw: {error['message']}" if error and error["rank"] != dead[0] else ""
            return CaseRecord(case_id, error=f"rank {dead[0]} died during the case (pid {self.watch.pids[dead[0]]})"
                                             f"{seen}", traceback=_tail(self.folder / "torchrun.log"))
        if error is not None:
            return CaseRecord(case_id, error=error["message"], error_rank=error["rank"],
                              traceback=error.get("traceback", ""))
        where, stacks = stuck_where(self.stacks), "\n".join(f"--- rank {rank} ---\n{text}"
                                                             for rank, text in sorted(self.stacks.items()))
        if problem == "timeout":
            return CaseRecord(case_id, error=f"no result after {waited:.0f}s (case timeout){where}", timeout=True,
                              traceback=stacks)
        if problem == "hung":
            return CaseRecord(case_id, error=f"hung: no rank used CPU time for {STALL_S:.0f}s (blocked or asleep), "
                                             f"{waited:.0f}s into the case{where}", timeout=True, traceback=stacks)
        return CaseRecord(case_id, error=f"worker group ({problem}, exit code {returncode}) before reporting: "
                                         f"{_tail(self.folder / 'torchrun.log')}")


STACKS_WAIT_S = 10.0  # how long the ranks get to write their stacks (they do it from a signal handler, at once)


def rank_stacks(folder: Path, pids: dict[int, int]) -> dict[int, str]:
    """Every rank's Python stacks, written by faulthandler on SIGUSR1 (harness.rank.worker registers it), read back
    before the group is killed: where a hung rank is stuck."""
    paths = {rank: folder / f"rank{rank}.stacks" for rank in pids}
    sizes = {rank: path.stat().st_size if path.exists() else 0 for rank, path in paths.items()}
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + STACKS_WAIT_S
    while time.monotonic() < deadline and not all(
            path.exists() and path.stat().st_size > sizes[rank] for rank, path in paths.items()):
        time.sleep(POLL_S)
    time.sleep(POLL_S)  # the last lines of a dump in progress
    return {rank: path.read_text(errors="replace")[sizes[rank]:] for rank, path in paths.items() if path.exists()
            and path.stat().st_size > sizes[rank]}


def stuck_where(stacks: dict[int, str]) -> str:
    """'; stuck: rank 0 in all_gather_object (distributed_c10d.py:3166), rank 1 in ...': the innermost frame of each
    rank's main thread (faulthandler prints the thread that took the signal first as 'Current thread')."""
    places = []
    for rank, text in sorted(stacks.items()):
        block = text.split("Current thread", 1)[-1] if "Current thread" in text else text
        frame = next((line.strip() for line in block.splitlines() if line.strip().startswith("File ")), None)
        if frame is None:
            continue
        match = re.match(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', frame)
        if match:
            places.append(f"rank {rank} in {match['func']} ({Path(match['path']).name}:{match['line']})")
    return f"; stuck: {', '.join(places)}" if places else ""


def _tail(path: Path, lines: int = 6) -> str:
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
