"""One live run per report folder.

Two runs in one folder read each other's rank events and pids, interleave their files and remove each other's work
folder (found when the README's two commands were started side by side in one checkout). A run holds an exclusive
`flock` on the folder's `run.lock` for as long as it lives; the kernel lets go when the process ends, however it
ends, so a killed run never leaves a stale lock. The file also says who holds it, for the refusal's one line. It
lives in the folder's work folder (`<report_dir>.work/run.lock`, harness.run.folders), never in the report folder a
CI job uploads; the lock guards both, and so the folder's own Inductor cache has one writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from harness.core.errors import HarnessError
from harness.run.folders import work_folder

LOCK_FILE = "run.lock"
_HELD: set[Path] = set()  # the folders this process holds


class FolderBusy(HarnessError):
    """Another live run holds the report folder."""


@contextlib.contextmanager
def report_folder_lock(folder: Path, command: list[str] | None = None) -> Iterator[Path]:
    """Hold `folder` (created if missing, with its work folder) for this run; refuse at once, naming the holder, when
    another run has it. Folders made here and left empty by a run that failed are removed again. Re-entrant within
    one process (the CLI takes the folder before it plans, the runner again when it runs)."""
    folder = Path(folder).resolve()
    work = work_folder(folder)
    path = work / LOCK_FILE
    if folder in _HELD:
        yield path
        return
    made = [each for each in (folder, work) if not each.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    handle = _locked(folder, path)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                                 "command": shlex.join(command if command is not None else _command())}))
        handle.flush()
        _HELD.add(folder)
        yield path
    except BaseException:
        for each in made:  # still held: a run that opened the file meanwhile retries (`_locked`)
            _remove_if_empty(each, path)
        raise
    finally:
        _HELD.discard(folder)
        handle.close()  # releases the lock


def _remove_if_empty(folder: Path, lock: Path) -> None:
    """Remove `folder` when nothing is in it but (for the work folder) the lock."""
    try:
        if folder == lock.parent and [entry.name for entry in folder.iterdir()] == [lock.name]:
            lock.unlink()
        folder.rmdir()  # refused unless empty: then it stays
    except OSError:
        pass


def _locked(folder: Path, path: Path):
    """The lock file, opened and held; again if the file we locked was removed meanwhile (a refused run tidying a
    folder it made): a lock on a file no longer at `path` holds nothing."""
    while True:
        handle = open(path, "a+")  # not truncated before the lock is ours: the holder's words stay readable
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise FolderBusy(_busy(folder, path)) from None
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
        handle.close()


def holder(folder: Path) -> dict | None:
    """Who holds (or last held) `folder`'s lock, as it wrote itself down; None when unreadable."""
    try:
        return json.loads((work_folder(Path(folder).resolve()) / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None


def _busy(folder: Path, path: Path) -> str:
    who = holder(folder) or {}
    since = time.strftime("%H:%M:%S", time.localtime(who["since"])) if "since" in who else "?"
    return (f"{folder} is in use by another harness run (pid {who.get('pid', '?')} on {who.get('host', '?')}, "
            f"since {since}: {who.get('command', '?')}); wait for it to end, or give this run another folder with "
            f"--report-dir DIR ({path} is its lock)")


def _command() -> list[str]:
    """How this process was started, as a person would type it (`harness run ...`, not the interpreter's path)."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("harness", "__main__.py"):
        argv[0] = "harness"
    return argv
