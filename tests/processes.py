"""What the launch tests check after a run: no torchrun or rank process of it is left (read from /proc)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def workers_naming(folder: Path, wait_s: float = 60.0) -> list[str]:
    """torchrun and rank processes still alive whose command line names `folder` (their group file lives there);
    waits up to `wait_s` for processes that were just killed to go away."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmdline and ("harness.engine.worker" in cmdline or "torch.distributed.run" in cmdline):
                found.append(f"{entry.name}: {cmdline}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def kill_leftovers(folder: Path) -> None:
    """A failed test must not leave its processes behind for the next one."""
    for line in workers_naming(folder, wait_s=0):
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
