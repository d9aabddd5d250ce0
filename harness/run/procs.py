"""What this host can see and do to its own processes: alive, CPU time used, stack dumps, and killing a torchrun tree.

Read from /proc, so only for processes on this node; another node's ranks are seen through its agent's status file
(harness.run.nodes). Any process may vanish at any moment (Inductor's compile workers and the C++ compiler come and
go all the time under a compiling rank): every look here takes a vanished pid as gone, never as an error.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from harness.core.records import STACKS_SIGNAL

POLL_S = 0.1  # how often the launcher and the node agents look at files and processes


def alive(pid: int) -> bool:
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


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process and of its children, live and reaped (Linux /proc); None where the
    process's own cannot be read. A rank compiling with torch.compile waits while Inductor's worker processes and
    the C++ compiler work: they are its progress."""
    own = _stat_seconds(pid)
    if own is None:
        return None
    return own + sum(_stat_seconds(child) or 0.0 for child in _descendants(pid))


def _stat_seconds(pid: int) -> float | None:
    """utime + stime + cutime + cstime (the last two: its children that it waited for)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` that is there now; one that exits mid-walk is left out."""
    found, todo = [], [pid]
    while todo:
        children = _children(todo.pop())
        found += children
        todo += children
    return found


def _children(pid: int) -> list[int]:
    """The children of each thread of `pid` (Linux's /proc/PID/task/TID/children); none for a vanished pid."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children = []
    for thread in threads:
        try:
            children += [int(child) for child in Path(f"/proc/{pid}/task/{thread}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return children


def ask_stacks(pids) -> None:
    """Every rank writes its Python stacks to its `.stacks` file at once (from a signal handler)."""
    for pid in pids:
        try:
            os.kill(pid, STACKS_SIGNAL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(process: subprocess.Popen) -> None:
    """torchrun's session: SIGTERM (torchrun then stops its ranks, each in a session of its own), SIGKILL if it does
    not go; ranks a torchrun killed outright left behind are `kill_ranks`' job."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=5)
        except (ProcessLookupError, PermissionError):  # gone (a reused pgid is not ours to signal)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(process.pid, signal.SIGKILL)  # ranks may outlive a torchrun that already exited
    except (ProcessLookupError, PermissionError):
        pass


def kill_ranks(pids, folder: Path) -> None:
    """Ranks still alive after their torchrun is gone: torchrun starts each rank in a session of its own, so a
    torchrun that was killed outright leaves them behind. Only processes whose command line names the launch's
    `folder` are killed (a pid may have been reused)."""
    for pid in pids:
        try:
            named = str(folder) in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if named:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def die_with_parent(sig: int = signal.SIGTERM):
    """A `preexec_fn`: the child gets `sig` when the process that started it dies (Linux), so a node's torchrun
    ends with the harness agent that started it, even when that agent is killed outright."""
    def set_it() -> None:
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    return set_it
