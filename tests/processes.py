"""What the launch tests check after a run: no torchrun, agent or rank process of it is left (read from /proc)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def workers_naming(folder: Path, wait_s: float = 60.0) -> list[str]:
    """torchrun, agent and rank processes still alive that belong to a run in `folder`: a torchrun or rank names
    its group file there on its command line; a rank or agent forked from the warm parent (whose command line is the
    parent's) holds its event or log file there open. Waits up to `wait_s` for processes just killed to go away."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if _named(cmdline, folder) or ("harness.engine.forkserver" in cmdline and _holds_a_file_in(entry, folder)):
                found.append(f"{entry.name}: {cmdline}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _named(cmdline: str, folder: Path) -> bool:
    return str(folder) in cmdline and ("harness.engine.worker" in cmdline or "torch.distributed.run" in cmdline)


def _holds_a_file_in(process: Path, folder: Path) -> bool:
    """Any of the process's open files is under `folder` (the warm parent itself holds none: only its forks do)."""
    try:
        descriptors = list((process / "fd").iterdir())
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(descriptor).startswith(f"{folder}{os.sep}"):
                return True
        except OSError:
            continue
    return False


def kill_leftovers(folder: Path) -> None:
    """A failed test must not leave its processes behind for the next one."""
    for line in workers_naming(folder, wait_s=0):
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
