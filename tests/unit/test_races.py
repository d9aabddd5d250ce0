"""Two runs, one folder, and the parent's own races: one live run per report folder, rank files read as streams,
process walks that a vanishing process cannot break, and a parent that hands over its reports when it fails.

Found by starting the README's two commands side by side in one checkout: both used `reports/work`, each read the
other's rank events (a half line ended `pytest -n 2` with 585 errors), and `harness run` died of a `/proc` walk
while a child process exited, with no report written.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.core import events
from harness.core.layouts import parse_layout
from harness.core.results import CaseResult, Status, read_results
from harness.run import handover, launch, partial, procs, runner
from harness.run.folders import launches_folder
from harness.run.lock import FolderBusy, holder, report_folder_lock
from harness.run.plan import Case, PlannedCase
from harness.run.tail import LineTail
from tests.processes import kill_leftovers, workers_naming

pytest_plugins = ["pytester"]

CHURN = Path(__file__).resolve().parents[1] / "churn"  # a sitecustomize that makes every rank churn children
HOLD = """
import sys, time
from harness.run.lock import report_folder_lock
with report_folder_lock(sys.argv[1], ["harness", "run", "--plan", "quick"]):
    print("held", flush=True)
    time.sleep(600)
"""


@contextlib.contextmanager
def _holder_process(folder: Path):
    """Another process holding `folder`, as a live run does (from when it holds it until it is killed)."""
    with subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout.readline().strip() == "held"
            yield process
        finally:
            process.kill()


# ------------------------------------------------------------------------------------ one live run per folder


def test_a_second_run_into_a_live_runs_folder_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "reports"
    with _holder_process(folder) as other:
        with pytest.raises(FolderBusy) as refused:
            with report_folder_lock(folder):
                pass
        said = str(refused.value)
        assert "\n" not in said
        assert f"pid {other.pid}" in said and "harness run --plan quick" in said and "--report-dir" in said
        assert holder(folder)["pid"] == other.pid  # the refused run changed nothing of the holder's
    with report_folder_lock(folder):  # the kernel let go of the killed holder's lock: no stale lock
        assert holder(folder)["pid"] == os.getpid()


def test_harness_run_into_a_live_runs_folder_exits_2_before_it_plans(project):
    with _holder_process(project / "reports") as other:
        refused = subprocess.run([sys.executable, "-m", "harness", "run", "--models", "flux", "--layouts", "single"],
                                 cwd=project, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {other.pid}" in lines[0] and "--report-dir DIR" in lines[0], refused.stderr
    assert "plan:" not in refused.stdout  # refused before planning or launching anything
    assert list((project / "reports").iterdir()) == []  # the lock is beside the artifact, not in it
    assert sorted(path.name for path in (project / "reports.work").iterdir()) == ["run.lock"]


def test_harness_merge_into_a_live_runs_folder_is_refused(tmp_path, capsys):
    from harness.cli import main

    with _holder_process(tmp_path / "merged") as other:
        code = main(["merge", str(tmp_path / "part1"), str(tmp_path / "part2"),
                     "--report-dir", str(tmp_path / "merged")])
    assert code == 2 and f"pid {other.pid}" in capsys.readouterr().err


def test_the_lock_is_reentrant_in_one_process_and_a_refused_run_leaves_no_folder_it_made(tmp_path):
    folder = tmp_path / "made" / "reports"
    with report_folder_lock(folder) as lock, report_folder_lock(folder):  # the CLI, then the runner
        assert holder(folder)["pid"] == os.getpid()
        assert lock == tmp_path / "made" / "reports.work" / "run.lock" and list(folder.iterdir()) == []
    with pytest.raises(RuntimeError, match="refused"):
        with report_folder_lock(folder / "new"):
            raise RuntimeError("refused before anything was written")
    assert not (folder / "new").exists() and not (folder / "new.work").exists()
    with pytest.raises(RuntimeError), report_folder_lock(folder):  # a folder that was there stays
        raise RuntimeError("refused")
    assert folder.is_dir()


def test_pytest_parity_items_write_to_a_folder_of_their_own_unless_told(project, pytester):
    """`harness run` writes to reports/, the parity items under pytest to reports.work/pytest: the README's two
    commands, started side by side, never share a folder, and the uploaded reports/ holds no test scratch."""
    from harness.plugin import settings_from

    pytester.makefile(".toml", pyproject='[tool.harness]\nreport_dir = "out"\n')
    config = pytester.parseconfig()
    assert settings_from(config).path("report_dir") == pytester.path / "out.work" / "pytest"
    config = pytester.parseconfig("--harness-report-dir", "elsewhere")
    assert settings_from(config).path("report_dir") == pytester.path / "elsewhere"


# ------------------------------------------------------------------------------------------- files as streams


def test_an_event_file_written_in_random_pieces_arrives_whole_and_once(tmp_path):
    """A writer thread appends events in pieces of 1 to 64 bytes (one byte at a time included); the tail, reading
    as fast as it can meanwhile, hands on each event once and only whole."""
    path = tmp_path / "rank0.jsonl"
    sent = [events.to_line(events.Start(0, float(i), f"flux/ulysses2/native/fp32/tensor#{i}")) for i in range(300)]
    data = "".join(line + "\n" for line in sent).encode()
    rng = random.Random(7)
    finished = threading.Event()

    def write() -> None:
        with open(path, "ab", buffering=0) as handle:
            at = 0
            while at < len(data):
                size = 1 if rng.random() < 0.3 else rng.randint(1, 64)
                handle.write(data[at:at + size])
                at += size
        finished.set()

    tail, got = LineTail(path), []
    writer = threading.Thread(target=write)
    writer.start()
    while not finished.is_set():
        got += [events.from_dict(json.loads(line)) for line in tail.lines()]
    writer.join()
    got += [events.from_dict(json.loads(line)) for line in tail.lines()]
    assert [events.to_line(event) for event in got] == sent


def test_a_torn_last_line_is_left_for_later_and_a_resumed_run_cuts_it_off(tmp_path):
    path = tmp_path / "rank1.jsonl"
    path.write_bytes(b'{"event": "done", "rank": 1, "time": 1.0}\n{"event": "hel')
    tail = LineTail(path)
    assert tail.lines() == ['{"event": "done", "rank": 1, "time": 1.0}'] and tail.lines() == []
    with open(path, "ab") as handle:
        handle.write(b'lo", "rank": 1, "time": 2.0, "pid": 9}\n')
    assert [type(events.from_dict(json.loads(line))) for line in tail.lines()] == [events.Hello]

    kept = CaseResult("flux/single/native/fp32/tensor", "flux", "default", "tensor", "single", 1, "native", "fp32",
                      Status.PASS)
    (tmp_path / partial.PARTIAL).write_text(json.dumps({"fingerprint": "f"}) + "\n" + json.dumps(kept.to_dict())
                                            + "\n" + json.dumps(kept.to_dict())[:30])
    assert list(partial.resume(tmp_path, asked=True, fingerprint="f")) == [kept.case_id]
    with open(tmp_path / partial.PARTIAL, "a") as handle:  # what the resumed run appends starts on a line of its own
        handle.write(json.dumps({**kept.to_dict(), "case_id": "flux/single/native/bf16/tensor"}) + "\n")
    assert len(partial.resume(tmp_path, asked=True, fingerprint="f")) == 2


# ------------------------------------------------------------------------------ processes that vanish mid-look


def test_a_process_tree_that_churns_never_breaks_the_walk():
    """A thread keeps starting and reaping children (and grandchildren) of this process while its tree is walked
    again and again: a child that exits mid-walk is gone, never an exception."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            subprocess.run(["sh", "-c", "true & true & wait"], check=False)

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        seen = [procs.cpu_seconds(os.getpid()) for _ in range(3000)]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert all(isinstance(value, float) for value in seen)


def test_every_look_at_a_vanished_pid_says_gone():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not procs.alive(gone.pid)
    assert procs.cpu_seconds(gone.pid) is None
    assert procs._descendants(gone.pid) == []
    procs.ask_stacks([gone.pid])
    procs.kill_ranks([gone.pid], Path("/nowhere"))
    procs.kill_tree(gone)


# ------------------------------------------------------------------- the real launcher under churn and faults


def _flux(layout: str, dtype: str = "fp32") -> PlannedCase:
    return PlannedCase(Case("flux", parse_layout(layout), "native", dtype))


@pytest.mark.slow
def test_ranks_that_keep_spawning_children_do_not_break_the_run(project, settings_for, monkeypatch):
    """Every rank starts and reaps short-lived children all the time (tests/churn), as a compiling rank does, while
    the launcher walks their process trees for CPU time. Two runs, each to its end with its reports."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(CHURN), os.environ.get("PYTHONPATH")])))
    plan = [_flux("single"), _flux("ulysses2"), _flux("tp2")]
    try:
        for attempt in range(2):
            report_dir = project / f"reports{attempt}"
            summary = runner.run(settings_for(report_dir=str(report_dir)), plan, echo=lambda _: None)
            assert summary.exit_code == 0, [(r.case_id, r.status, r.reason) for r in summary.results]
            assert (report_dir / "index.html").exists() and (report_dir / "results.json").exists()
        assert workers_naming(project) == []
    finally:
        kill_leftovers(project)


def _raising_once_a_case_is_done(report_dir: Path, original):
    """`original`, raising once a case has finished (its line is in the partial file): a bug of the parent that
    shows mid-run, while ranks are working."""
    def wrapper(*args, **kwargs):
        path = report_dir / partial.PARTIAL
        if path.exists() and len(path.read_text().splitlines()) > 1:
            raise RuntimeError(f"injected at {original.__qualname__}")
        return original(*args, **kwargs)

    return wrapper


POLL_POINTS = {  # each place the parent looks at its ranks while they run
    "events": (launch._Watch, "poll"),
    "deaths": (launch._Watch, "dead_ranks"),
    "stalls": (launch._Watch, "stalled_for"),
    "cpu": (procs, "cpu_seconds"),
    "up": (launch._Launch, "_say_up"),
    "judge": (runner, "judge"),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", POLL_POINTS)
def test_an_internal_error_at_a_poll_point_hands_over_reports_and_a_resumable_run(point, project, settings_for,
                                                                                 monkeypatch):
    report_dir = project / "reports"
    owner, name = POLL_POINTS[point]
    where = getattr(owner, name).__qualname__
    monkeypatch.setattr(owner, name, _raising_once_a_case_is_done(report_dir, getattr(owner, name)))
    plan = [_flux("single"), _flux("single", "bf16"), _flux("ulysses2")]
    said = []
    try:
        with pytest.raises(handover.RunStopped) as stopped:
            runner.run(settings_for(), plan, echo=said.append)
        assert workers_naming(project) == [], "ranks outlived the parent's internal error"
    finally:
        kill_leftovers(project)
    assert stopped.value.exit_code == 3
    assert said[-1] == str(stopped.value) and "\n" not in said[-1]
    assert f"RuntimeError: injected at {where}" in said[-1]
    assert "harness run --resume --report-dir reports" in said[-1]  # relative to where it ran
    header, results = read_results(report_dir / "results.json")
    assert header.incomplete.startswith("the harness stopped at an internal error: RuntimeError: injected")
    finished = [r for r in results if r.case_id not in stopped.value.unfinished]
    assert finished and all(r.status is Status.PASS for r in finished), [(r.case_id, r.reason) for r in results]
    assert stopped.value.unfinished and all(r.status is Status.ERROR and "--resume" in r.reason
                                            for r in results if r.case_id in stopped.value.unfinished)
    assert "Incomplete run: the harness stopped at an internal error" in (report_dir / "index.html").read_text()
    assert "**Incomplete run**" in (report_dir / "matrix.md").read_text()
    assert "RuntimeError: injected" in (launches_folder(report_dir) / handover.TRACEBACK_FILE).read_text()
    fingerprint = json.loads((report_dir / partial.PARTIAL).read_text().splitlines()[0])["fingerprint"]
    kept = partial.resume(report_dir, asked=True, fingerprint=fingerprint)
    assert sorted(kept) == sorted(r.case_id for r in finished)


@pytest.mark.slow
def test_harness_run_stopped_by_an_internal_error_exits_3_and_resume_finishes_it(project, zoo_references):
    """The CLI end to end: an internal error (injected by a sitecustomize of the test's, in the parent only) ends
    `harness run` with exit code 3 and one line; `harness run --resume` then runs only the rest and exits 0."""
    inject = project / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import harness.run.launch as launch\n"
        "original = launch._Watch.dead_ranks\n"
        "def dead_ranks(self):\n"
        "    if any(p.name == 'results.partial.jsonl' and len(p.read_text().splitlines()) > 1\n"
        "           for p in self.workdir.parents[2].glob('reports/results.partial.jsonl')):\n"
        "        raise RuntimeError('injected in the parent')\n"
        "    return original(self)\n"
        "launch._Watch.dead_ranks = dead_ranks\n")
    args = [sys.executable, "-m", "harness", "run", "--models", "flux", "--layouts", "single,ulysses2",
            "--backends", "native", "--dtypes", "fp32,bf16", "--kinds", "tensor", "--references", str(zoo_references),
            "--known-issues", "none.toml"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(inject), os.environ.get("PYTHONPATH")]))}
    try:
        first = subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=900, env=env)
        resumed = subprocess.run([*args, "--resume"], cwd=project, capture_output=True, text=True, timeout=900)
        assert workers_naming(project) == []
    finally:
        kill_leftovers(project)
    assert first.returncode == 3, first.stdout + first.stderr
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith("harness: internal error: RuntimeError: injected in the parent"), first.stdout
    assert "Traceback" not in first.stdout + first.stderr
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    kept = int(last.split(" finished case(s)")[0].rsplit(" ", 1)[1])
    assert f"{kept} kept from the interrupted run" in resumed.stdout
    header, results = read_results(project / "reports" / "results.json")
    assert header.incomplete is None and {r.status for r in results} == {Status.PASS}
    # the resumed run's folder is the artifact alone: no partial file, lock, cache or work files
    assert sorted(path.name for path in (project / "reports").iterdir()) == ["index.html", "matrix.csv", "matrix.md",
                                                                           "results.json"]


PARITY_TESTS = '''
from harness.plugin import check_parity


def test_parity(parity_case, parity_results):
    check_parity(parity_case, parity_results)
'''


@pytest.mark.slow
def test_under_pytest_an_internal_error_is_one_failure_not_one_per_item(pytester, zoo_references):
    pytester.makefile(".toml", pyproject='[tool.harness]\nmodels = ["flux"]\nlayouts = ["single", "ulysses2"]\n'
                      'backends = ["native"]\ndtypes = ["fp32", "bf16"]\nkinds = ["tensor"]\nmodes = ["eager"]\n'
                      'loads = ["enable"]\nflows = ["none"]\n'
                      f'references = "{zoo_references}"\nknown_issues = "none.toml"\n')
    pytester.makeconftest(
        "import harness.run.launch as launch\n"
        "original = launch._Watch.poll\n"
        "def poll(self):\n"
        "    found = original(self)\n"
        "    if found:\n"
        "        raise RuntimeError('injected in the parent')\n"
        "    return found\n"
        "launch._Watch.poll = poll\n")
    pytester.makepyfile(test_matrix=PARITY_TESTS)
    ran = pytester.runpytest_subprocess("-q", "-rs", "-p", "no:cacheprovider")
    ran.assert_outcomes(failed=1, skipped=3)
    ran.stdout.fnmatch_lines(["*harness: internal error: RuntimeError: injected in the parent*--resume*",
                              "*not run: the parity run stopped before this case (the cause is test_parity[[]*]'s*"])


@pytest.mark.slow
def test_the_readme_commands_side_by_side_in_one_checkout_both_pass(project, zoo_references):
    """`harness run` and `pytest` started together in one project (as a new user runs the README's two commands in
    two terminals): each has its own folder, both end green."""
    (project / "pyproject.toml").write_text(
        '[tool.harness]\nmodels = ["flux"]\nlayouts = ["single", "ulysses2", "tp2"]\nbackends = ["native"]\n'
        f'dtypes = ["fp32"]\nkinds = ["tensor"]\nmodes = ["eager"]\nloads = ["enable"]\n'
        'flows = ["none"]\n'
        f'references = "{zoo_references}"\n'
        'known_issues = "none.toml"\n')
    (project / "test_matrix.py").write_text(PARITY_TESTS)
    main = subprocess.Popen([sys.executable, "-m", "harness", "run"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_matrix.py"],
                               cwd=project, capture_output=True, text=True, timeout=900)
        said, _ = main.communicate(timeout=900)
    finally:
        main.send_signal(signal.SIGTERM)
        kill_leftovers(project)
    assert main.returncode == 0, said
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout
    assert len(read_results(project / "reports" / "results.json")[1]) == 3
    assert len(read_results(project / "reports.work" / "pytest" / "results.json")[1]) == 3


WAITER = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "w"), all_threads=True)
if sys.argv[2] == "lock":
    from filelock import FileLock
    print("ready", flush=True)
    FileLock(sys.argv[3]).acquire()
else:
    print("ready", flush=True)
    time.sleep(600)
"""


def _stacks_of_a_process_that(how: str, tmp_path: Path) -> str:
    """The faulthandler stacks (as a rank writes them) of a real process waiting for a held file lock, or asleep."""
    out = tmp_path / f"{how}.stacks"
    child = subprocess.Popen([sys.executable, "-c", WAITER, str(out), how, str(tmp_path / "cache.lock")],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        while True:  # until the child is inside the lock's poll or the sleep: its stack says so
            child.send_signal(signal.SIGUSR1)
            text = out.read_text() if out.exists() else ""
            if ("filelock" in text) if how == "lock" else ("<module>" in text):
                return text
            threading.Event().wait(0.2)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_ranks_waiting_for_a_file_lock_another_process_holds_are_waiting_not_hung(tmp_path):
    """Two runs side by side compile into one Inductor cache: one run's ranks wait for the other's cache lock using no
    CPU time, which the stall check alone took for a hang (TIMEOUT in the README's second command). Their stacks
    say so; a rank asleep or blocked elsewhere still reads as stuck."""
    from filelock import FileLock

    from harness.run.stacks import waiting_on_lock

    with FileLock(str(tmp_path / "cache.lock")):
        locked = _stacks_of_a_process_that("lock", tmp_path)
    asleep = _stacks_of_a_process_that("sleep", tmp_path)
    assert waiting_on_lock({0: locked, 1: locked})
    assert not waiting_on_lock({0: locked, 1: asleep})  # one rank elsewhere: the group may be hung
    assert not waiting_on_lock({0: asleep})
    assert not waiting_on_lock({})
