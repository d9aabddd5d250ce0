"""Plan groups to torchrun launches: one launch per world size, many cases each.

A case that hangs, raises on one rank, or loses a rank costs only itself: the launcher kills the group and
relaunches it for the cases left. It watches the ranks' event files and their process ids, never a pipe.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.plan import Case

POLL_S = 0.1
RANK_ERROR_GRACE_S = 5.0  # a rank's error, then no result: the other ranks are stuck in a collective
STARTUP_TIMEOUT_S = 180.0  # imports, gloo/NCCL init and rendezvous


@dataclass
class Outcome:
    """What the launcher learned about one case: the worker's record, or why none came."""

    case: Case
    record: dict = field(default_factory=dict)
    timeout: bool = False


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
        elif kind == "start" and event["rank"] == 0:
            self.current, self.started_at = case_id, time.monotonic()
        elif kind == "rank_error":
            self.rank_errors.setdefault(case_id, {}).setdefault(event["rank"], {**event, "seen": time.monotonic()})
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


def launch_command(world_size: int, group_file: Path) -> list[str]:
    # torchrun checks its ranks every --monitor-interval and then stops the survivors; at its 0.1 s default it can
    # stop them before the launcher (every POLL_S) has seen which rank died first, and the wrong rank gets blamed.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            "--monitor-interval=1", "-m", "harness.worker", str(group_file)]


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


def run_group(cases: list[Case], settings: dict, workdir: Path, case_timeout: float,
              on_outcome: Callable[[Outcome], None]) -> int:
    """Run every case of one world size, relaunching after a hang or crash until each has an outcome.

    Returns the number of torchrun launches it took.
    """
    remaining, attempt = list(cases), 0
    while remaining:
        attempt += 1
        folder = workdir / f"ws{remaining[0].world_size}-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        done = _Launch(remaining, settings, folder, case_timeout, on_outcome).run()
        remaining = [case for case in remaining if case.case_id not in done]
    return attempt


class _Launch:
    """One torchrun launch over `cases`; stops at the first case it has to give up on."""

    def __init__(self, cases, settings, folder: Path, case_timeout: float, on_outcome):
        self.by_id = {case.case_id: case for case in cases}
        self.folder, self.case_timeout, self.on_outcome = folder, case_timeout, on_outcome
        self.world_size = cases[0].world_size
        self.watch = _Watch(folder, self.world_size)
        self.done: set[str] = set()
        group = {**settings, "workdir": str(folder), "cases": [case.to_dict() for case in cases]}
        (folder / "group.json").write_text(json.dumps(group))

    def run(self) -> set[str]:
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
            self._blame(problem, process.poll())  # before the kill, which would make every rank look dead
            kill_tree(process)
            return

    def _deliver(self, events: list[dict]) -> None:
        dead = self.watch.dead_ranks()
        for event in events:
            if "error" in event and dead:  # rank 0's "connection closed" is a symptom: name the rank that died
                event = {**event, "error": f"rank {dead[0]} died during the case; rank 0 saw: {event['error']}",
                         "error_rank": None}
            self.done.add(event["case_id"])
            self.on_outcome(Outcome(self.by_id[event["case_id"]], event))

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
        error, dead = self.watch.first_error(case_id), self.watch.dead_ranks()
        if dead:  # the others' errors ("connection closed") are symptoms: name the rank that died
            seen = f"; rank {error['rank']} saw: {error['message']}" if error and error["rank"] != dead[0] else ""
            return Outcome(case, {"error": f"rank {dead[0]} died during the case (pid {self.watch.pids[dead[0]]})"
                                           f"{seen}", "traceback": _tail(self.folder / "torchrun.log")})
        if error is not None:
            return Outcome(case, {"error": error["message"], "error_rank": error["rank"],
                                  "traceback": error.get("traceback", "")})
        if problem == "timeout":
            return Outcome(case, {"error": f"no result after {waited:.0f}s (case timeout)"}, timeout=True)
        return Outcome(case, {"error": f"worker group ({problem}, exit code {returncode}) before reporting: "
                                       f"{_tail(self.folder / 'torchrun.log')}"})


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
