"""The warm parent of a run's ranks: one process that imports torch, diffusers and the rank's code once, then forks
the ranks of every launch on this host (harness.run.warm is its client, in the launcher).

A torchrun launch pays its ranks' imports every time (14 to 24 s for 2 ranks on a loaded 2-core machine, against
0.2 s forked: docs/measured.md, "The test command"). Per launch this process forks an agent, which does what
torchrun's agent does: it starts a session of its own (the launcher stops the launch with one signal to it), hosts
the process group's TCP store, forks the ranks with torchrun's environment and, once a rank fails, gives the launcher
a second to see which one before it stops the rest. Nothing a case does reaches the next launch: every launch's ranks
are fresh forks of this process, which never runs a case itself.

Run as `python -m harness.engine.forkserver [--listen SOCKET]`; it reads one JSON request per line on stdin and
answers on stdout, and with `--listen` the same on each connection to SOCKET (`Server`). A connection may also hand
it a whole command with its standard streams and the function that runs it (harness.run.warm.run_in_shared): the
command then runs in a fork of this process, with torch and diffusers already imported. It must not start threads
(checked before each launch's fork: `other_threads`) or touch an accelerator before forking, so it serves CPU runs
only (harness.run.warm).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

import harness

POLL_S = 0.1
MONITOR_S = 1.0  # after a rank fails, the launcher's time to see which one before the others are stopped (torchrun's
# --monitor-interval in harness.run.launchers)
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process gets `sig` when the one that forked or started it dies (Linux PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)
    except (OSError, AttributeError):
        pass


def warm_imports() -> None:
    """What every rank imports before its first case, paid here once."""
    import diffusers  # noqa: F401

    import harness.engine.worker  # noqa: F401 - torch, torch.distributed and the harness's rank code
    from harness.catalogue.zoo import SPECS

    for spec in SPECS.values():  # diffusers imports each model's module on first use
        try:
            getattr(diffusers, spec.class_name)
        except Exception:  # noqa: BLE001 - a class this release lacks: its cases say so themselves
            pass


class Server:
    """Reads requests, forks an agent for each, reaps agents and writes each one's exit code where asked.

    Requests come on stdin from the process that started it, and, with `--listen PATH`, on connections to a unix
    socket from the processes that one starts (`harness` commands a pytest session runs: harness.run.warm.share).
    A connection first asks `hello` (the environment, interpreter and harness this process imported, which its
    client compares with its own); it may then ask for launches, or hand over a command (`command`, with its
    standard streams), whose exit code it is sent when the command ends. When a connection closes, its launches and
    command are stopped, as all are when stdin closes."""

    def __init__(self, answers, listener: socket.socket | None = None) -> None:
        self.answers, self.listener, self.pending = answers, listener, b""
        # agent or command pid -> (the agent's exit file, None for a command; its connection's fd)
        self.agents: dict[int, tuple[str | None, int | None]] = {}
        # a connection's fd -> [its socket, what it sent past its last line, the descriptors it sent]
        self.clients: dict[int, list] = {}
        self.started_with = {"env": dict(os.environ), "harness": harness.__file__, "pid": os.getpid(),
                             "executable": sys.executable, "flags": list(sys.flags), "warnoptions": sys.warnoptions}

    def serve(self) -> None:
        while True:
            sources = [0, *([self.listener.fileno()] if self.listener else []), *self.clients]
            readable, _, _ = select.select(sources, [], [], POLL_S)
            self.reap()
            for source in readable:
                if source == 0:
                    chunk = os.read(0, 65536)
                    if not chunk:  # the launcher closed the pipe or died: stop every launch still running
                        self.stop_all()
                        return
                    self.pending = self.handle(self.pending + chunk, None)
                elif self.listener is not None and source == self.listener.fileno():
                    client, _ = self.listener.accept()
                    self.clients[client.fileno()] = [client, b"", []]
                else:
                    self.read_client(source)

    def read_client(self, fd: int) -> None:
        client = self.clients[fd]
        try:
            chunk, fds, _, _ = socket.recv_fds(client[0], 65536, 3)
        except OSError:
            chunk, fds = b"", []
        client[2].extend(fds)
        if not chunk:  # its launcher is gone: so are its launches and its command
            self.stop_all(fd)
            self.close_client(fd)
            return
        client[1] = self.handle(client[1] + chunk, fd)

    def close_client(self, fd: int) -> None:
        client = self.clients.pop(fd)
        for descriptor in client[2]:
            os.close(descriptor)
        client[0].close()

    def handle(self, pending: bytes, fd: int | None) -> bytes:
        """Serve each whole line of `pending`; returns the rest."""
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            if "hello" in request:
                self.answer(fd, self.started_with)
            elif "command" in request:
                self.answer(fd, self.fork_command(request, fd))
            else:
                self.answer(fd, self.fork_agent(request, fd))
        return pending

    def answer(self, fd: int | None, message: dict) -> None:
        line = json.dumps(message) + "\n"
        if fd is None:
            self.answers.write(line)
            self.answers.flush()
            return
        try:
            self.clients[fd][0].sendall(line.encode())
        except OSError:
            pass  # gone: its next read says so

    def fork_agent(self, request: dict, fd: int | None) -> dict:
        """The launch's agent, forked; refused (said, and the launcher starts torchrun) while this process holds any
        thread but the one forking (`other_threads`)."""
        others = other_threads()
        if others:
            return {"error": f"the warm parent holds {len(others)} thread(s) besides its own ({', '.join(others)}): "
                             "a fork copies only the forking thread, and a lock one of them holds would stay locked "
                             "in every rank"}
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.forget()
            _agent_process(request)  # never returns
        self.agents[pid] = (request["exit_file"], fd)
        return {"agent": pid}

    def fork_command(self, request: dict, fd: int) -> dict:
        """A command in a fork of this process, on the standard streams its connection sent: `call`
        ("module:function") called with its arguments and when it started. Its module, and the modules it names in
        `imports` (what the command imports as it runs), are imported here, once, so every later fork has them."""
        streams, self.clients[fd][2] = self.clients[fd][2], []
        try:
            if len(streams) != 3:
                raise ValueError(f"a command needs its 3 standard streams, {len(streams)} came")
            module, _, name = request["call"].partition(":")
            for imported in request.get("imports", []):
                importlib.import_module(imported)
            function = getattr(importlib.import_module(module), name)
        except Exception as error:  # noqa: BLE001 - said to the client, which then runs the command itself
            for descriptor in streams:
                os.close(descriptor)
            return {"error": f"{type(error).__name__}: {error}"}
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for target, descriptor in enumerate(streams):
                os.dup2(descriptor, target)
            for descriptor in streams:
                os.close(descriptor)
            self.forget()
            _command_process(request, function)  # never returns
        for descriptor in streams:  # the command's now: kept here, a reader of its output would never see the end
            os.close(descriptor)
        self.agents[pid] = (None, fd)
        return {"command": pid}

    def forget(self) -> None:
        """In a fork: the sockets and descriptors of the server are not the child's (a client's death must close
        its connection, and the descriptors it sent belong to the command they were sent for)."""
        if self.listener is not None:
            self.listener.close()
        for fd in list(self.clients):
            self.close_client(fd)

    def reap(self) -> None:
        while self.agents:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            exit_file, fd = self.agents.pop(pid, (None, None))
            if exit_file:
                _write_atomically(exit_file, str(os.waitstatus_to_exitcode(status)))
            elif fd in self.clients:  # a command: its client waits for the code
                self.answer(fd, {"exit": os.waitstatus_to_exitcode(status)})

    def stop_all(self, fd: int | None = None) -> None:
        """Every launch and command (`fd` None: stdin closed) or those one connection asked for."""
        mine = [pid for pid, (_, client) in self.agents.items() if fd is None or client == fd]
        for pid in mine:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if fd is not None:
            return  # reaped by the loop, which goes on serving the others
        deadline = time.monotonic() + STOP_GRACE_S
        while self.agents and time.monotonic() < deadline:
            self.reap()
            time.sleep(POLL_S)


def other_threads() -> list[str]:
    """This process's threads but the calling one, each named: a Python thread by its name, another by its id. None
    after the warm imports: the ranks' thread pools (OpenMP's, gloo's, Inductor's compile workers) start in the
    ranks, and a launcher starts this process with one thread for OpenMP and OpenBLAS (harness.run.launchers.node_env;
    OpenBLAS's own fork handler stops its idle threads before a fork anyway)."""
    me = threading.get_native_id()
    named = {thread.native_id: thread.name for thread in threading.enumerate()}
    try:
        tids = sorted(int(tid) for tid in os.listdir("/proc/self/task"))
    except OSError:  # no /proc: nothing to tell
        return []
    return [f"Python thread {named[tid]!r}" if tid in named else f"native thread {tid}" for tid in tids if tid != me]


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _agent_process(request: dict) -> None:
    """The forked agent: its own session, the launch's log as stdout and stderr, the launcher's environment."""
    code = 1
    try:
        os.setsid()
        die_with_parent()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1), os.dup2(log, 2), os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("path"):  # the launcher's own (a project's modules, a kind or load of its own)
            sys.path[:] = request["path"]
        print(f"launch forked by warm parent {os.getppid()} for launcher {request['watch']}", flush=True)
        code = Agent(request["world_size"], request["group"], request["watch"]).run()
    except BaseException:  # noqa: BLE001 - said in the launch's log, which the launcher quotes
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def _command_process(request: dict, function) -> None:
    """The forked command: the client's directory, environment, import path and arguments, in a session of its own
    (its connection closing, as when its client dies, stops the session). Exits as the command would have."""
    import atexit

    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:], sys.argv = request["path"], request["command"]
        for stream in (sys.stdout, sys.stderr):  # as a fresh interpreter would buffer them for these streams
            stream.reconfigure(line_buffering=stream is sys.stderr or stream.isatty())
        atexit._clear()  # this process's own exit functions are not the command's  # noqa: SLF001
        _client_signals(**request["signals"])
        code = function(sys.argv[1:], request["started"])
    except SystemExit as stop:  # as the interpreter ends on one
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - the command's own traceback, on its own stderr
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # noqa: SLF001
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)


def _client_signals(forwarded: list[int], ignored: list[int]) -> None:
    """The signal dispositions the command would have started with in its client's place, not this process's: a
    warm parent started by a process that ignores SIGINT (a CI job's `pytest &` under a non-interactive shell, where
    a test's Ctrl-C then went unanswered) would otherwise pass that on to every command forked from it."""
    for signum in forwarded:
        if signum in ignored:
            signal.signal(signum, signal.SIG_IGN)
        else:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


class Agent:
    """torchrun's agent for one launch on this host: a store, the ranks, and the first failure stopping the rest."""

    def __init__(self, world_size: int, group_file: str, watch: int) -> None:
        self.world_size, self.group_file, self.watch = world_size, group_file, watch
        self.ranks: dict[int, int] = {}  # pid -> rank

    def run(self) -> int:
        pipes = {}
        for rank in range(self.world_size):  # forked before the store's threads exist: a fork copies no thread
            read, write = os.pipe()
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(write)
                _rank_process(rank, self.world_size, read, self.group_file)  # never returns
            os.close(read)
            self.ranks[pid], pipes[rank] = rank, write
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", 0, self.world_size, True, wait_for_workers=False)
        for write in pipes.values():
            os.write(write, f"{store.port}\n".encode())
            os.close(write)
        return self.wait()

    def wait(self) -> int:
        failed_at, failure = None, 0
        while self.ranks:
            if not _alive(self.watch):  # the launcher died outright: nobody will read what the ranks write
                os.killpg(0, signal.SIGKILL)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if failed_at is not None:
                    self.stop(time.monotonic() - failed_at)
                time.sleep(POLL_S)
                continue
            rank, code = self.ranks.pop(pid, None), os.waitstatus_to_exitcode(status)
            if rank is not None and code != 0:
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                print(f"rank {rank} (pid {pid}) failed: {how}", flush=True)
                if failed_at is None:
                    failed_at, failure = time.monotonic(), 1
        return failure

    def stop(self, since_failure: float) -> None:
        """The survivors of a failed rank: SIGTERM after MONITOR_S, SIGKILL after STOP_GRACE_S more."""
        if since_failure < MONITOR_S:
            return
        sig = signal.SIGTERM if since_failure < MONITOR_S + STOP_GRACE_S else signal.SIGKILL
        for pid in self.ranks:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rank_process(rank: int, world_size: int, port_pipe: int, group_file: str) -> None:
    """One rank, as torchrun would start it, on the agent's store."""
    code = 1
    try:
        die_with_parent()
        with os.fdopen(port_pipe) as pipe:
            port = pipe.readline().strip()
        if not port:  # the agent died before its store was up
            os._exit(1)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                           "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                           "ROLE_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                           "TORCHELASTIC_USE_AGENT_STORE": "True"})
        sys.argv = ["harness.engine.worker", group_file]
        from harness.engine import worker

        code = worker.main([group_file])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - the rank's own traceback, in the launch's log as torchrun's ranks print it
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.engine.forkserver [--listen SOCKET]`"""
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()  # the launcher's death ends this process, whose death ends every agent and rank
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything an import prints goes to stderr, never into the answers
    listener = None
    if argv[:1] == ["--listen"]:  # bound before the imports: a client that connects meanwhile waits in the backlog
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(argv[1])
        listener.listen(64)
    warm_imports()
    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    answers.flush()
    Server(answers, listener).serve()
    # Served and every launch stopped: the interpreter's own teardown (0.9 s with torch and diffusers imported,
    # which the launcher would wait for as it exits) has nothing left to do for anyone.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
