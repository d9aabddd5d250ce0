"""Hang and crash diagnostics: before a hung group is killed, every rank on every node dumps its Python stacks, and
the TIMEOUT reason names where each rank is stuck; a rank that dies in native code has left its own stack (its
faulthandler, harness.engine.worker), and the ERROR names where it died."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from harness.run import procs
from harness.run.procs import POLL_S
from harness.run.tail import LineTail

FATAL = "Fatal Python error: "  # how faulthandler begins the stack of a process a fatal signal ends
STACKS_WAIT_S = 10.0  # how long the ranks get to write their stacks (they do it from a signal handler, at once)


def rank_stacks(folder: Path, watch) -> dict[int, str]:
    """Every rank's Python stacks, written by faulthandler on SIGUSR1 (harness.engine.worker registers it), read back
    before the group is killed: where a hung rank is stuck. Another node's agent signals its own ranks. Only what
    the ranks write after the request counts, in whole lines."""
    tails = {rank: LineTail(path, LineTail.size(path))
             for rank, path in ((rank, folder / f"rank{rank}.stacks") for rank in watch.pids)}
    procs.ask_stacks(pid for rank, pid in watch.pids.items() if not watch.nodes.get(rank))
    if watch.view is not None:
        watch.view.ask_stacks()
    written: dict[int, list[str]] = {rank: [] for rank in tails}
    deadline = time.monotonic() + STACKS_WAIT_S
    while True:
        for rank, tail in tails.items():
            written[rank] += tail.lines()
        if all(written.values()) or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    time.sleep(POLL_S)  # the last lines of a dump in progress
    for rank, tail in tails.items():
        written[rank] += tail.lines()
    return {rank: "\n".join(lines) + "\n" for rank, lines in written.items() if lines}


def _main_frames(text: str) -> list[str]:
    """The frame lines of the main thread's stack, innermost first (faulthandler prints the thread that took the
    signal first, as 'Current thread', up to the next thread's block)."""
    block = text.split("Current thread", 1)[-1] if "Current thread" in text else text
    block = block.split("\nThread ", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]


def _innermost(text: str) -> str | None:
    return next(iter(_main_frames(text)), None)


def waiting_on_lock(stacks: dict[int, str]) -> bool:
    """Every rank waits inside a file lock's acquire (the `filelock` package: Inductor's and Triton's caches take
    one). Another process holds it, typically another run compiling into the same Inductor cache: the group waits,
    it is not hung; the case timeout still bounds the wait."""
    inside = f"{os.sep}filelock{os.sep}"
    return bool(stacks) and all(any(inside in frame for frame in _main_frames(text)) for text in stacks.values())


def stuck_where(stacks: dict[int, str], name: Callable[[int], str] = "rank {}".format) -> str:
    """'; stuck: rank 0 in all_gather_object (distributed_c10d.py:3166), rank 1 in ...': the innermost frame of each
    rank's main thread (faulthandler prints the thread that took the signal first as 'Current thread')."""
    named = [f"{name(rank)} {place}" for rank, text in sorted(stacks.items()) if (place := _place(text))]
    return f"; stuck: {', '.join(named)}" if named else ""


def death_stack(folder: Path, rank: int) -> tuple[str, str] | None:
    """What a rank ended by a fatal signal wrote of it: ('Aborted in _abort_self (reliability.py:54)', the whole
    stack), or None when it wrote nothing (SIGKILL leaves no stack)."""
    try:
        text = (folder / f"rank{rank}.stacks").read_text(errors="replace")
    except OSError:
        return None
    if FATAL not in text:
        return None
    stack = FATAL + text.rsplit(FATAL, 1)[1]
    what, place = stack.splitlines()[0].removeprefix(FATAL), _place(stack)
    return (f"{what} {place}" if place else what), stack


def _place(text: str) -> str | None:
    """'in all_gather_object (distributed_c10d.py:3166)': the innermost frame of the main thread's stack."""
    match = re.match(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', _innermost(text) or "")
    return f"in {match['func']} ({Path(match['path']).name}:{match['line']})" if match else None
