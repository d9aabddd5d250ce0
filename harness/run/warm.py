"""The launcher's side of forked ranks: one warm parent (harness.engine.forkserver) per process, started as the run
begins so its imports overlap the plan, asked for each launch on this host.

It serves what it can serve alone and exactly: one host, CPU ranks (a parent that forks must not have touched CUDA)
and no `--coverage` (coverage must start before diffusers is imported). Everything else, and any launch it cannot
start, goes to torchrun as before. The warm parent is kept for the life of the process, so every run of one pytest
session's worker shares it; a change of environment (PYTHONPATH, a plugin kind) starts a fresh one. A process can
also share one with the processes it starts (`share`: the `harness` commands a pytest session runs), which use it
when they would have started the same one.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import harness
from harness.core.errors import process_age_s
from harness.run import procs
from harness.run.timing import TIME_LOG

if TYPE_CHECKING:
    from harness.run.settings import Settings

READY_TIMEOUT_S = 180.0  # its imports, on a loaded machine (the same bound as a torchrun launch's start-up)
LOG = "ranks.log"  # a forked launch's agent and ranks write here what torchrun's would write to torchrun.log
# The sockets (os.pathsep between them) of the warm parents a process shares with those it starts (share), each
# started for one environment: a launch's ranks' (harness.run.launchers.node_env) and a command's own.
SHARED = "HARNESS_WARM_PARENT"
# Variables that differ between the runs of one pytest session, or appear while a run plans, and mean nothing to
# imports: the test's name, the Inductor cache folder (set in the launcher by torch's first use of it; each rank sets
# its own, harness.engine.worker), the shared parents' sockets, the file a launcher appends its time breakdown to
# (benchmarks/bench_tests.py names one per test item), and the terminal's size (LINES and COLUMNS: in a pytest
# worker, something sets them in the environment its children get, not in os.environ).
IGNORED = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", SHARED, TIME_LOG, "LINES", "COLUMNS")


@dataclass
class ForkedLaunch:
    """One launch's agent, seen from the launcher: what a `subprocess.Popen` of torchrun offers `harness.run.launch`
    and `procs.kill_tree` (the agent leads a session of its own, so one signal to the group stops every rank)."""

    pid: int
    exit_file: Path
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._code()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked launch {self.pid}", timeout)
            time.sleep(procs.POLL_S)
        return self.returncode

    def _code(self) -> int | None:
        """The exit code the warm parent wrote when it reaped the agent; an agent gone with no code written (its
        warm parent died with it) is -9."""
        for _ in range(2):
            try:
                return int(self.exit_file.read_text())
            except (OSError, ValueError):
                pass
            if procs.alive(self.pid):
                return None
            time.sleep(10 * procs.POLL_S)  # reaped a moment ago: the code is on its way
        return -signal.SIGKILL


class _Connection:
    """A warm parent another process started (share), reached over its socket: what WarmParent uses of a Popen."""

    def __init__(self, client: socket.socket, pid: int) -> None:
        self.stdin, self.stdout, self.pid = client.makefile("wb"), client, pid

    def poll(self) -> int | None:
        return None if self.stdout.fileno() >= 0 else 0

    def wait(self, timeout: float | None = None) -> int:
        return 0  # closing the socket (`_stop`) is all: that parent stops this process's launches itself

    def kill(self) -> None:
        self.stdin.close()
        self.stdout.close()


class WarmParent:
    """The process-wide warm parent: started once, restarted when it died or the environment changed. A process
    whose environment names a shared one (SHARED) for the same environment and harness uses that one instead."""

    def __init__(self, listen: str | None = None) -> None:
        self.listen = listen  # a socket its children reach it on (share)
        self.process: subprocess.Popen | _Connection | None = None
        self.errors = None  # its stderr, quoted when it fails to start
        self.key: dict | None = None
        self.ready = False
        self.failed: str | None = None
        self.lock = threading.Lock()

    def prepare(self, env: dict[str, str]) -> None:
        """Start it now (its imports take seconds) unless one for this environment is up or starting."""
        with self.lock:
            self._started_for(env)

    def launch(self, world_size: int, group_file: Path, folder: Path, env: dict[str, str]) -> ForkedLaunch | str:
        """The forked launch, or why there is none (the launcher then starts torchrun)."""
        with self.lock:
            self._started_for(env)
            if not self._wait_ready():
                return self.failed or "the warm parent did not start"
            exit_file = folder / "agent.exit"
            request = {"world_size": world_size, "group": str(group_file), "log": str(folder / LOG),
                       "exit_file": str(exit_file), "cwd": os.getcwd(), "env": env, "watch": os.getpid(),
                       "path": sys.path}
            try:
                self.process.stdin.write((json.dumps(request) + "\n").encode())
                self.process.stdin.flush()
                answer = self._answer(READY_TIMEOUT_S)
            except (OSError, ValueError) as error:
                answer = None
                self.failed = f"the warm parent stopped answering ({error})"
            if answer and "error" in answer:  # it refused to fork (harness.engine.forkserver.Server.fork_agent)
                self.failed = answer["error"]
            if not answer or "agent" not in answer:
                self._stop()
                return self.failed or "the warm parent stopped answering"
            return ForkedLaunch(answer["agent"], exit_file)

    def _started_for(self, env: dict[str, str]) -> None:
        key = _key(env)
        if self.process is not None and self.process.poll() is None and key == self.key:
            return
        self._stop()
        self.key, self.ready, self.failed = key, False, None
        self.process = None if self.listen else self._shared(env.get(SHARED), key)
        if self.process is not None:
            self.ready = True
            return
        self.errors = tempfile.TemporaryFile()
        listen = ["--listen", self.listen] if self.listen else []
        self.process = subprocess.Popen([sys.executable, "-m", "harness.engine.forkserver", *listen],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, env=env,
                                        start_new_session=True, preexec_fn=procs.die_with_parent(signal.SIGKILL))

    @staticmethod
    def _shared(path: str | None, key: dict) -> _Connection | None:
        """The shared warm parent at `path` when it imported what this process would (same environment, same
        harness); None when there is none, it does not answer, or it differs."""
        said = _hello(path, key)
        return None if said is None else _Connection(said[0], said[1].get("pid", 0))

    def _wait_ready(self) -> bool:
        if not self.ready:
            answer = self._answer(READY_TIMEOUT_S)
            self.ready = bool(answer and "ready" in answer)
            if not self.ready:
                self.failed = f"the warm parent did not start: {self._said()}"
                self._stop()
        return self.ready

    def _answer(self, timeout: float) -> dict | None:
        """Its next answer line; None when it exits or says nothing within `timeout`."""
        out = self.process.stdout
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            if not select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            chunk = os.read(out.fileno(), 1)
            if not chunk:
                return None
            line += chunk
        return json.loads(line)

    def _said(self) -> str:
        """The last lines the warm parent wrote to stderr (an import that failed)."""
        if self.errors is None:
            return "?"
        self.errors.seek(0)
        lines = [line for line in self.errors.read().decode(errors="replace").splitlines() if line.strip()]
        return " | ".join(lines[-4:]) or f"exit code {self.process.poll() if self.process else '?'}"

    def _stop(self) -> None:
        """Closing its stdin stops it, and every launch it still runs (their agents die with it); one still importing
        has no launch and is killed rather than waited for."""
        process, ready, self.process, self.ready = self.process, self.ready, None, False
        if process is not None:
            if not ready:
                process.kill()
            try:
                process.stdin.close()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
            process.stdout.close()
        if self.errors is not None:
            self.errors.close()
            self.errors = None

    def close(self) -> None:
        with self.lock:
            self._stop()


def _key(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in IGNORED}


def _hello(paths: str | None, key: dict) -> tuple[socket.socket, dict] | None:
    """A connection to the first shared warm parent of `paths` (SHARED's value) that imported what this process
    would (same environment, same harness), and what it says of itself; None when none does or answers."""
    for path in (paths or "").split(os.pathsep):
        if not path:
            continue
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.settimeout(READY_TIMEOUT_S)  # it answers once its own imports are done
            client.connect(path)
            client.sendall(b'{"hello": 1}\n')
            answer = json.loads(client.makefile("rb").readline() or b"{}")
            client.settimeout(None)
        except (OSError, ValueError):
            client.close()
            continue
        if _key(answer.get("env", {})) == key and answer.get("harness") == harness.__file__:
            return client, answer
        client.close()
    return None


_PARENT = WarmParent()
atexit.register(_PARENT.close)


def shared() -> WarmParent:
    return _PARENT


def share(folder: Path, env: dict[str, str]) -> WarmParent:
    """A warm parent for `env` that the processes this one starts (and theirs) use when theirs is `env`: started for
    a launch's environment, the `harness` commands and pytest sessions of a pytest session fork their ranks from it
    instead of importing torch and diffusers for a warm parent of their own (about 5 s of CPU each); started for
    the session's own, its `harness` commands run in a fork of it (run_in_shared). Its socket is added to SHARED;
    `close()` it."""
    parent = WarmParent(listen=str(folder / "warm.sock"))
    parent.prepare(env)
    os.environ[SHARED] = os.pathsep.join(filter(None, [os.environ.get(SHARED), parent.listen]))
    return parent


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what run_in_shared passes on to the command


def run_in_shared(argv: list[str], call: str, imports: tuple[str, ...] = ()) -> int | None:
    """Run this `harness` command (`argv` as sys.argv) in a fork of a shared warm parent (SHARED), which has torch
    and diffusers imported, when its environment, interpreter and harness are this process's: there `call`
    ("module:function") is called with `argv[1:]` and when this process started, `imports` imported beforehand in
    the warm parent (once for every command). The command's exit code, or None to run it here. A command the
    pytest session's tests start would otherwise import them itself (about 6 s of CPU, even to refuse a bad
    option). The fork gets this process's standard streams, directory, environment and import path; a signal this
    process gets is passed on to it, and its death by a signal is this process's; this process's death (its
    connection closes) stops it."""
    said = _hello(os.environ.get(SHARED), _key(dict(os.environ)))
    if said is None:
        return None
    client, answer = said
    if (answer.get("executable"), answer.get("flags"), answer.get("warnoptions")) != (
            sys.executable, list(sys.flags), sys.warnoptions):
        client.close()
        return None
    # a signal this process was started ignoring (`nohup`, or a non-interactive shell's `&` for SIGINT) is not
    # passed on, and the command ignores it too: it must not get the warm parent's dispositions instead
    ignored = [signum for signum in FORWARDED if signal.getsignal(signum) is signal.SIG_IGN]
    request = {"command": list(argv), "call": call, "imports": list(imports), "cwd": os.getcwd(),
               "env": dict(os.environ), "path": sys.path, "started": time.monotonic() - (process_age_s() or 0.0),
               "signals": {"forwarded": list(FORWARDED), "ignored": ignored}}
    command, waiting = None, []

    def forward(signum, _frame) -> None:
        if command is None:
            waiting.append(signum)
            return
        try:
            os.kill(command, signum)
        except ProcessLookupError:  # it has just ended: its code is on its way
            pass

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED if signum not in ignored}
    try:
        answers = client.makefile("rb")
        try:
            socket.send_fds(client, [(json.dumps(request) + "\n").encode()], [0, 1, 2])
            started = json.loads(answers.readline() or b"{}")
        except (OSError, ValueError):  # e.g. a standard stream closed: nothing ran, so run it here
            return None
        if "command" not in started:
            return None
        command = started["command"]
        for signum in waiting:
            forward(signum, None)
        ended = answers.readline()
        if not ended:
            print(f"harness: error: the warm parent running this command died ({SHARED}={os.environ[SHARED]})",
                  file=sys.stderr)
            return 1
        code = json.loads(ended)["exit"]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        client.close()
        if command is None and waiting:  # asked to stop before anything ran: stop here, not run it here
            signal.raise_signal(waiting[0])
    if code < 0:  # killed by a signal: so is this process, as its parent would see of the command run here
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def start_early(settings: Settings) -> None:
    """Start the warm parent as `harness run` begins, before the launcher imports torch, so the two imports overlap
    instead of the first launch waiting for the parent's (about 5 s a run on 2 cores, docs/measured.md). A guess
    made without torch: `serves` stops it again on a machine with CUDA."""
    from harness.run.launchers import node_env

    if _asked(settings):
        _PARENT.prepare(node_env(0))


def serves(settings: Settings) -> bool:
    """Whether this run's launches on this host fork from the warm parent."""
    import torch

    if torch.cuda.is_available():
        _PARENT.close()  # started early on a guess (start_early): CUDA ranks start under torchrun
        return False
    return _asked(settings)


def _asked(settings: Settings) -> bool:
    """The run's options let its ranks fork (`--rank-start fork`, and no `--coverage`, which must start first)."""
    return settings.rank_start == "fork" and not settings.coverage
