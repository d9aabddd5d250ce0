"""Plan groups to torchrun launches: one launch per world size, many cases each.

A case that hangs or crashes costs only itself: its group is killed and relaunched for the cases left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from harness.plan import Case

POLL_S = 0.1
RANK_ERROR_GRACE_S = 10.0


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
    current: str | None = None
    started_at: float = 0.0
    rank_errors: dict[str, dict] = field(default_factory=dict)

    def poll(self) -> list[dict]:
        """New events from every rank; tracks the case in flight and non-zero ranks' errors."""
        results = []
        for rank in range(self.world_size):
            path = self.workdir / f"rank{rank}.jsonl"
            if not path.exists():
                continue
            with open(path) as handle:
                handle.seek(self.offsets.get(rank, 0))
                chunk = handle.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self.offsets[rank] = self.offsets.get(rank, 0) + len(complete.encode())
            for line in complete.splitlines():
                event = json.loads(line)
                results.extend(self._on(event))
        return results

    def _on(self, event: dict) -> list[dict]:
        kind, case_id = event["event"], event.get("case_id")
        if kind == "start" and event["rank"] == 0:
            self.current, self.started_at = case_id, time.monotonic()
        elif kind == "rank_error":
            self.rank_errors.setdefault(case_id, event)
        elif kind == "result":
            self.current = None
            return [event]
        return []


def launch_command(world_size: int, group_file: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            "-m", "harness.worker", str(group_file)]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # One thread per rank: ranks share the machine's cores (and torchrun prints a banner when this is unset).
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("DIFFUSERS_VERBOSITY", "error")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def kill_tree(process: subprocess.Popen) -> None:
    """torchrun and its ranks share one session: signal them all, then wait, so no orphan survives."""
    if process.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
    try:
        os.killpg(process.pid, signal.SIGKILL)  # ranks may outlive a torchrun that already exited
    except (ProcessLookupError, PermissionError):
        pass


def run_group(cases: list[Case], settings: dict, workdir: Path, case_timeout: float,
              on_outcome: Callable[[Outcome], None], on_start: Callable[[str], None] = lambda _: None) -> int:
    """Run every case of one world size, relaunching after a hang or crash until each has an outcome.

    Returns the number of torchrun launches it took.
    """
    remaining = list(cases)
    attempt = 0
    while remaining:
        attempt += 1
        folder = workdir / f"ws{remaining[0].world_size}-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        done = _launch_once(remaining, settings, folder, case_timeout, on_outcome, on_start)
        remaining = [case for case in remaining if case.case_id not in done]
    return attempt


def _launch_once(cases, settings, folder: Path, case_timeout: float, on_outcome, on_start) -> set[str]:
    by_id = {case.case_id: case for case in cases}
    group_file = folder / "group.json"
    group_file.write_text(json.dumps({**settings, "workdir": str(folder), "cases": [c.to_dict() for c in cases]}))
    log_path = folder / "torchrun.log"
    world_size = cases[0].world_size
    done: set[str] = set()
    watch = _Watch(folder, world_size)
    announced: str | None = None
    with open(log_path, "w") as log:
        process = subprocess.Popen(launch_command(world_size, group_file), stdout=log, stderr=subprocess.STDOUT,
                                   env=worker_env(), start_new_session=True)
        try:
            while True:
                for event in watch.poll():
                    done.add(event["case_id"])
                    on_outcome(Outcome(by_id[event["case_id"]], event))
                if watch.current and watch.current != announced:
                    announced = watch.current
                    on_start(announced)
                if len(done) == len(cases):
                    break
                stuck = _stuck_case(watch, case_timeout)
                exited = process.poll() is not None
                if stuck is None and not exited:
                    time.sleep(POLL_S)
                    continue
                for event in watch.poll():  # the last lines written before the exit or the kill
                    done.add(event["case_id"])
                    on_outcome(Outcome(by_id[event["case_id"]], event))
                kill_tree(process)
                _blame(watch, by_id, done, stuck, exited, process.returncode, log_path, on_outcome)
                break
        finally:
            kill_tree(process)
    return done


def _stuck_case(watch: _Watch, case_timeout: float) -> tuple[str, str] | None:
    """(case_id, 'timeout' | 'rank_error') when the case in flight must be given up."""
    if watch.current is None:
        return None
    waited = time.monotonic() - watch.started_at
    if watch.current in watch.rank_errors and waited > RANK_ERROR_GRACE_S:
        return watch.current, "rank_error"
    if waited > case_timeout:
        return watch.current, "timeout"
    return None


def _blame(watch, by_id, done, stuck, exited, returncode, log_path: Path, on_outcome) -> None:
    """Give the case in flight (or, if none started, every case) its outcome after a kill or a crash."""
    if stuck is not None:
        case_id, why = stuck
        if why == "timeout":
            elapsed = time.monotonic() - watch.started_at
            on_outcome(Outcome(by_id[case_id], {"error": f"no result after {elapsed:.0f}s (case timeout)"}, True))
        else:
            error = watch.rank_errors[case_id]
            on_outcome(Outcome(by_id[case_id], {"error": error["message"], "error_rank": error["rank"],
                                                "traceback": error.get("traceback", "")}))
        done.add(case_id)
        return
    tail = _tail(log_path)
    victims = [watch.current] if watch.current else [cid for cid in by_id if cid not in done]
    for case_id in victims:
        error = watch.rank_errors.get(case_id)
        message = f"rank {error['rank']}: {error['message']}" if error else \
            f"worker group exited with code {returncode} before reporting: {tail}"
        on_outcome(Outcome(by_id[case_id], {"error": message, "traceback": tail}))
        done.add(case_id)


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def group_by_world_size(cases: Iterable[Case]) -> dict[int, list[Case]]:
    groups: dict[int, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.world_size, []).append(case)
    return dict(sorted(groups.items()))
