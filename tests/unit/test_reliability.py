"""Reliability with real processes, where a case that hangs or dies must cost only itself: hangs, crashes, signals,
resume, concurrent capture, xdist, and references from another diffusers version.

Each fault costs one relaunch, so the fault cases share one run; each launch-heavy test is one test function, so
`pytest -n 2` never runs a launch twice. About 110 s alone, 85 s with `-n 2` on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core.figures import limit, value
from harness.core.layouts import parse_layout
from harness.core.results import CaseResult, Status, read_results
from harness.run import partial, runner
from harness.run.folders import launches_folder
from harness.run.plan import Case, PlannedCase
from tests.processes import kill_leftovers, workers_naming

pytest_plugins = ["pytester"]

# Far beyond any clean case on a loaded machine: the hang below is found by the stall detection (no rank uses CPU
# time), which does not depend on machine speed, never by this timeout.
CASE_TIMEOUT = 600
FLUX_2 = ["--models", "flux", "--backends", "native", "--dtypes", "fp32", "--kinds", "tensor", "--modes", "eager",
          "--loads", "enable", "--flows", "none"]


# ---------------------------------------------------------------------------------------------------- helpers


def _case(model: str, layout: str, fault: str | None = None) -> Case:
    return Case(model, parse_layout(layout), "native", "fp32", fault=fault)


def _harness(*args, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _results(report_dir: Path) -> dict[str, dict]:
    return {case["case_id"]: case for case in json.loads((report_dir / "results.json").read_text())["cases"]}


# ------------------------------------------------------------- a hang, a raise and a kill among clean cases

HANG, RAISE, KILL = "flux/tp2/native/fp32/tensor+hang_rank1", "flux/ulysses2/native/fp32/tensor+raise_rank1", \
    "flux/tp2/native/fp32/tensor+kill_rank1"
ABORT = "qwenimage/ulysses2/native/fp32/tensor+abort_rank1"
FAULT_PLAN = [_case("flux", "ulysses2"), _case("flux", "tp2", "hang_rank1"), _case("flux", "tp2"),
              _case("flux", "ulysses2", "raise_rank1"), _case("qwenimage", "ulysses2"),
              _case("flux", "tp2", "kill_rank1"), _case("qwenimage", "tp2"),
              _case("qwenimage", "ulysses2", "abort_rank1")]
DELIBERATE = "RuntimeError: deliberate failure on rank 1 (raise_rank1)"
# its own faulthandler's stack, written as the abort ended it, names where rank 1 died
ABORTED = r"rank 1 died during the case \(pid \d+\): Aborted in _abort_self \(reliability.py:\d+\)(; rank 0 saw: .*)?"


def _launched_first(report_dir: Path) -> list[str]:
    """The first case of each launch, in launch order (from the group files the launcher wrote)."""
    groups = sorted(launches_folder(report_dir).glob("ws2-*/group.json"), key=lambda p: int(p.parent.name[4:]))
    return [Case.from_dict(json.loads(p.read_text())["cases"][0]).case_id for p in groups]


@pytest.mark.slow
def test_a_hang_a_raise_a_kill_and_an_abort_each_cost_only_their_own_case(project, settings_for):
    """One run, one world size: each faulty case ends its launch; the cases after it run in a relaunched group. A
    rank that dies in native code (as glibc aborts on a corrupted heap) is named with where it died."""
    try:
        summary = runner.run(settings_for(case_timeout=CASE_TIMEOUT), [PlannedCase(c) for c in FAULT_PLAN],
                             echo=lambda _: None)
        assert workers_naming(project) == [], "worker processes outlived `runner.run`"
    finally:
        kill_leftovers(project)
    results = {result.case_id: result for result in summary.results}
    clean = [case.case_id for case in FAULT_PLAN if case.fault is None]
    assert {cid: results[cid].status for cid in clean} == dict.fromkeys(clean, Status.PASS), \
        {cid: results[cid].reason for cid in clean}
    # the first launch, one more after each fault, and the abort's rerun in a fresh group (its rank dies again)
    assert summary.header.launches == 5
    assert _launched_first(project / "reports") == [FAULT_PLAN[i].case_id for i in (0, 2, 4, 6, 7)]

    assert results[HANG].status is Status.TIMEOUT
    assert re.fullmatch(r"hung: no rank used CPU time for \d+s \(blocked or asleep\), \d+s into the case; "
                        r"stuck: rank 0 in \S+ \(\S+:\d+\), rank 1 in _sleep_forever \(reliability.py:\d+\)",
                        results[HANG].reason), results[HANG].reason
    stacks = results[HANG].extra["traceback"]  # every rank's Python stacks, taken before the kill
    assert "--- rank 0 ---" in stacks and "--- rank 1 ---" in stacks and "harness/faults/reliability.py" in stacks

    assert results[RAISE].status is Status.ERROR
    assert results[RAISE].reason == f"rank 1: {DELIBERATE}"
    traceback = results[RAISE].extra["traceback"]
    assert traceback.rstrip().endswith(DELIBERATE), traceback
    assert "harness/faults/reliability.py" in traceback and 'raise RuntimeError("deliberate failure' in traceback

    assert results[KILL].status is Status.ERROR
    assert results[KILL].reason.startswith("rank 1 died during the case"), results[KILL].reason
    assert "Fatal Python error" not in results[KILL].extra.get("traceback", "")  # SIGKILL leaves no stack

    # a native death is rerun once in a fresh group; the rerun's rank dies again: its ERROR, the first kept beside it
    assert results[ABORT].status is Status.ERROR
    first = results[ABORT].rank_death or {}
    for reason, stack in ((results[ABORT].reason, results[ABORT].extra["traceback"]),
                          (first.get("error", ""), first.get("traceback", ""))):
        assert re.fullmatch(ABORTED, reason), reason
        assert stack.startswith("Fatal Python error: Aborted") and "harness/faults/reliability.py" in stack, stack
    assert re.search(r"pid (\d+)", first["error"])[1] != re.search(r"pid (\d+)", results[ABORT].reason)[1]
    assert results[KILL].rank_death is None  # a SIGKILL is no native death: not rerun


ONCE = "flux/ulysses2/native/fp32/tensor+abort_rank1_once"


@pytest.mark.slow
def test_a_case_whose_rank_dies_in_native_code_runs_once_more_in_a_fresh_group_and_keeps_the_death(project,
                                                                                                    settings_for):
    """Rank 1 aborts in the case's first attempt only (as glibc aborts on a corrupted heap): the case runs once more
    as the first of a fresh launch and PASSes there, marked with the death it had (never a silent retry: its
    reason and stack kept in results.json, said as it happens and in the run's summary); the case after it runs
    once."""
    said: list[str] = []
    plan = [_case("flux", "ulysses2", "abort_rank1_once"), _case("qwenimage", "ulysses2")]
    try:
        summary = runner.run(settings_for(case_timeout=CASE_TIMEOUT), [PlannedCase(c) for c in plan], echo=said.append)
        assert workers_naming(project) == [], "worker processes outlived `runner.run`"
    finally:
        kill_leftovers(project)
    _header, written = read_results(project / "reports" / "results.json")
    results = {result.case_id: result for result in written}
    assert {cid: r.status for cid, r in results.items()} == dict.fromkeys(results, Status.PASS), \
        {cid: r.reason for cid, r in results.items()}
    assert summary.header.launches == 2 and _launched_first(project / "reports") == [ONCE, ONCE]
    death = results[ONCE].rank_death or {}
    assert re.fullmatch(ABORTED, death.get("error", "")), death
    assert death["traceback"].startswith("Fatal Python error: Aborted"), death["traceback"]
    assert results[ONCE].reason == f"PASS on its rerun in a fresh group; in its first attempt {death['error']}"
    assert results["qwenimage/ulysses2/native/fp32/tensor"].rank_death is None
    assert any(line.startswith(f"  {ONCE}: rank 1 died during the case") and "once more in a fresh group" in line
               for line in said), said
    assert f"rank deaths: 1 (a native signal; each case ran once more in a fresh group): {ONCE} PASS on its rerun" \
        in " ".join(" ".join(said).split()), said[-6:]  # the summary's line, wrapped to the terminal's width


# ------------------------------------------------------------------ ranks forked from one warm parent stay apart

NUMERIC_FAULTS = [_case("flux", "ulysses2", "cp_local_attention"), _case("flux", "ulysses2"),
                  _case("flux", "tp2", "tp_skip_allreduce"), _case("flux", "tp2")]


@pytest.mark.slow
def test_a_faulty_case_then_its_clean_twin_on_one_warm_group_fail_then_pass(project, settings_for):
    """A fault patches diffusers inside the ranks; the clean case after it on the same forked ranks, and a second run
    whose ranks fork from the same warm parent, must see diffusers as it is. The faulty cases must FAIL (so the
    fault really ran on those ranks) and their clean twins PASS."""
    from harness.run import warm

    settings = settings_for(case_timeout=CASE_TIMEOUT)
    try:
        first = runner.run(settings, [PlannedCase(c) for c in NUMERIC_FAULTS], echo=lambda _: None)
        parent = warm.shared().process.pid
        launch = launches_folder(project / "reports") / "ws2-1"  # kept: a case failed
        forked = (launch / warm.LOG).exists() and not (launch / "torchrun.log").exists(), sorted(launch.iterdir())
        second = runner.run(settings, [PlannedCase(_case("flux", "ulysses2"))], echo=lambda _: None)
        assert workers_naming(project) == [], "worker processes outlived `runner.run`"
        threads = sorted(os.listdir(f"/proc/{parent}/task"))  # after two runs' launches: their threads are the ranks'
    finally:
        kill_leftovers(project)
    assert warm.shared().process.pid == parent, "the second run's ranks did not fork from the same warm parent"
    assert threads == [str(parent)], threads
    statuses = {result.case_id: result.status for result in first.results}
    assert statuses == {"flux/ulysses2/native/fp32/tensor+cp_local_attention": Status.FAIL,
                        "flux/ulysses2/native/fp32/tensor": Status.PASS,
                        "flux/tp2/native/fp32/tensor+tp_skip_allreduce": Status.FAIL,
                        "flux/tp2/native/fp32/tensor": Status.PASS}, statuses
    assert [result.status for result in second.results] == [Status.PASS], second.results
    assert first.header.launches == 1  # all four on the same two ranks
    assert forked[0], forked[1]


THREAD_POOLS = """
import json, os, sys
from harness.engine import forkserver
forkserver.warm_imports()
seen = {"the warm imports": forkserver.other_threads()}
import torch
torch.set_num_threads(2)
(torch.ones(1 << 22) * 2).sum()
seen["OpenMP"] = forkserver.other_threads()
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.barrier()
seen["gloo"] = forkserver.other_threads()
from torch._inductor import config
from torch._inductor.async_compile import AsyncCompile
config.compile_threads = 2
AsyncCompile.process_pool()
seen["Inductor's compile workers"] = forkserver.other_threads()
answers = open(sys.argv[1], "w")
forkserver.Server(answers).handle(json.dumps({"world_size": 2, "exit_file": "-"}).encode() + b"\\n", None)
answers.close()
print(json.dumps(seen), flush=True)
os._exit(0)
"""


def test_the_warm_parent_forks_with_no_thread_but_its_own_and_refuses_beside_one(tmp_path):
    """What a warm parent imports starts no thread, so nothing a rank needs can be left locked by another thread at
    the fork; each pool a rank starts (OpenMP's, gloo's, Inductor's compile workers) would add threads, and with
    any of them the warm parent refuses to fork a launch (its launcher then starts torchrun, saying why). The
    process is started as a launcher starts its warm parent (harness.run.launchers.node_env)."""
    from harness.run.launchers import node_env

    answers = tmp_path / "answers"
    done = subprocess.run([sys.executable, "-c", THREAD_POOLS, str(answers)], capture_output=True, text=True,
                          env=node_env(0), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen.pop("the warm imports") == [], seen
    counts = [len(threads) for threads in seen.values()]
    assert counts == sorted(set(counts)) and counts[0] > 0, seen  # each pool adds threads of its own
    assert "Python thread 'InductorSubproc'" in seen["Inductor's compile workers"], seen
    refused = json.loads(answers.read_text())
    assert "agent" not in refused, refused
    assert refused["error"].startswith(f"the warm parent holds {counts[-1]} thread(s) besides its own (native "), \
        refused


GLOO_WORKERS = """
import os, sys
if sys.argv[1] == "shimmed":
    from harness.rank import cpu
    cpu.apply()
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
groups = [dist.group.WORLD, dist.new_group([0])]
print(*(group._get_backend(torch.device("cpu")).options._threads for group in groups), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize(("start", "workers"), [("shimmed", "1 1"), ("plain", "2 2")])
def test_a_ranks_gloo_groups_run_their_collectives_on_one_worker_thread_each(start, workers):
    """gloo runs a group's collectives on two worker threads, so two issued back to back run at once, which
    corrupted a rank's heap (docs/reliability.md#heap-corruption); a rank's CPU shims give every group it makes,
    the world's and a subgroup's, one. The plain process is the control: gloo's two each."""
    done = subprocess.run([sys.executable, "-c", GLOO_WORKERS, start], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == workers, done.stdout


# ---------------------------------------------------------------------------- signals to `harness run`, resume


def _start_hanging_run(project: Path, zoo_references: Path, layouts: str) -> subprocess.Popen:
    """`harness run` whose 2-rank case hangs (rank 1 sleeps), with a case timeout far beyond the test's patience;
    in its own session, so the signal reaches the harness and its process group only, as Ctrl-C would."""
    args = ["run", "--references", str(zoo_references), *FLUX_2, "--layouts", layouts,
            "--inject-fault", "hang_rank1", "--case-timeout", "600"]
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_as_a_terminal)


def _as_a_terminal() -> None:
    """Ctrl-C as an interactive shell's job gets it: SIGINT caught by default and not blocked. Seen in the full suite
    under xdist: a run started from the test worker ignored SIGINT there (an ignored or blocked signal is inherited
    across exec; a shell does the same to a background job, which the harness then rightly leaves alone)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_masks(pid: int) -> dict[str, int]:
    """The process's blocked, ignored and caught signal masks ({} once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {name: int(mask, 16) for name, mask in (line.split(":\t") for line in status)
            if name in ("SigBlk", "SigIgn", "SigCgt")}


def _signal_state(pid: int) -> str:
    """The masks, for a failure message."""
    return " ".join(f"{name}: {mask:016x}" for name, mask in _signal_masks(pid).items()) or "(gone)"


def _ignores(pid: int, signum: int) -> bool:
    return bool(_signal_masks(pid).get("SigIgn", 0) >> (signum - 1) & 1)


def _wait_for_hang(project: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until rank 1 of the 2-rank launch has reported that it started the (hanging) case."""
    events = launches_folder(project / "reports") / "ws2-1" / "rank1.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if events.exists() and any(json.loads(line)["event"] == "start" for line in events.read_text().splitlines()
                                   if line.endswith("}")):
            time.sleep(0.5)  # rank 1 is now in its sleep, rank 0 in the collective
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.1)
    raise AssertionError("the hanging case never started")


def _interrupt(project: Path, process: subprocess.Popen, send) -> tuple[int, str, str, float, list[str]]:
    """Send a signal once the case hangs; returns (exit code, stdout, stderr, seconds to exit, survivors)."""
    try:
        _wait_for_hang(project, process)
        process.signal_state = _signal_state(process.pid)  # what the signal meets, said if it goes unanswered
        sent = time.monotonic()
        send(process)
        out, err = process.communicate(timeout=60)
        return process.returncode, out, err, time.monotonic() - sent, workers_naming(project)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        kill_leftovers(project)


@pytest.mark.slow
def test_sigterm_kills_the_worker_group_and_exits(project, zoo_references):
    process = _start_hanging_run(project, zoo_references, "ulysses2")
    code, out, err, _seconds, survivors = _interrupt(project, process, lambda p: p.send_signal(signal.SIGTERM))
    assert code == 128 + signal.SIGTERM, err
    assert "harness: interrupted" in err
    assert "interrupted: 0 case(s) finished in this run; 0 of 1 are in" in out and "(nothing to resume)" in out
    assert "Traceback" not in err
    assert survivors == []


@pytest.mark.slow
def test_ctrl_c_keeps_finished_cases_and_resume_runs_only_the_rest(project, zoo_references):
    process = _start_hanging_run(project, zoo_references, "single,ulysses2")  # 1 rank (passes), then 2 (hangs)
    code, out, err, _seconds, survivors = _interrupt(project, process, lambda p: os.killpg(p.pid, signal.SIGINT))
    assert code == 130, (process.signal_state, out[-3000:], err)
    assert "harness: interrupted" in err
    assert "interrupted: 1 case(s) finished in this run; 1 of 2 are in" in out
    assert "(rerun with --resume to run the rest)" in out
    assert "Traceback" not in err
    assert survivors == []
    single, hung = "flux/single/native/fp32/tensor+hang_rank1", "flux/ulysses2/native/fp32/tensor+hang_rank1"
    assert f"PASS    {single}" in out
    header, *partial = [json.loads(line) for line in
                        (project / "reports/results.partial.jsonl").read_text().splitlines()]
    assert set(header) == {"fingerprint"}  # what --resume checks before it keeps anything
    assert [(row["case_id"], row["status"]) for row in partial] == [(single, "PASS")]
    assert not (project / "reports/results.json").exists()

    resumed = _harness("run", "--references", str(zoo_references), *FLUX_2, "--layouts", "single,ulysses2",
                       "--inject-fault", "hang_rank1", "--case-timeout", "2", "--resume", cwd=project)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr  # the hanging case is now a TIMEOUT
    assert "2 to run, " in resumed.stdout and ", 1 kept from the interrupted run" in resumed.stdout
    assert "launching 1 case(s) on 2 rank(s)" in resumed.stdout
    assert f"[2/2] TIMEOUT {hung}" in resumed.stdout  # progress counts the kept case
    assert "on 1 rank(s)" not in resumed.stdout  # the finished case was not run again
    final = _results(project / "reports")
    assert final[single]["status"] == "PASS" and final[single]["seconds"] == partial[0]["seconds"]
    assert final[hung]["status"] == "TIMEOUT" and "case timeout" in final[hung]["reason"]
    assert not (project / "reports/results.partial.jsonl").exists()
    assert workers_naming(project) == []


@pytest.mark.slow
def test_ctrl_c_reaches_a_command_forked_from_a_warm_parent_that_ignores_it(project, zoo_references, monkeypatch,
                                                                           tmp_path_factory):
    """A shared warm parent started while SIGINT is ignored (as under a CI job's `pytest &` in a non-interactive
    shell) gives the commands it forks their client's signal dispositions, not its own. Found so: a clean-clone
    `.ci/run` started that way failed the Ctrl-C test above, the forked run ignoring the SIGINT its client passed
    on and running on to the hang's TIMEOUT (exit 1, not 130)."""
    from harness.run import warm

    session = os.environ.get(warm.SHARED, "")
    monkeypatch.setenv(warm.SHARED, session)  # put back as it was, after share() adds to it
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the warm parent inherits across exec
    try:
        deaf = warm.share(tmp_path_factory.mktemp("deaf"), dict(os.environ))
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert _ignores(deaf.process.pid, signal.SIGINT)
        # the command runs in a fork of this one (the first for its environment), its ranks in the session's
        monkeypatch.setenv(warm.SHARED, os.pathsep.join(filter(None, [deaf.listen, session])))
        process = _start_hanging_run(project, zoo_references, "ulysses2")
        code, out, err, _seconds, survivors = _interrupt(project, process, lambda p: os.killpg(p.pid, signal.SIGINT))
    finally:
        deaf.close()
    assert code == 130, (out[-3000:], err)
    assert "harness: interrupted" in err and "Traceback" not in err
    assert survivors == []


def test_a_command_keeps_ignoring_a_signal_it_was_started_ignoring(monkeypatch):
    """`nohup harness run` (SIGHUP ignored) keeps running on a hangup; SIGTERM, not ignored, still unwinds it."""
    from harness import cli

    seen = {}
    monkeypatch.setitem(cli.COMMANDS, "run", lambda _args: seen.update(
        {signum: signal.getsignal(signum) for signum in (signal.SIGHUP, signal.SIGTERM)}) or 0)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert cli.main(["run"]) == 0
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert seen == {signal.SIGHUP: signal.SIG_IGN, signal.SIGTERM: cli._terminate}


def test_resume_reruns_a_case_whose_line_a_killed_run_tore(tmp_path):
    """A run killed (not interrupted) mid-write leaves a torn last line: that case reruns, the others are kept."""
    kept = CaseResult("flux/single/native/fp32/tensor", "flux", "default", "tensor", "single", 1, "native", "fp32",
                      Status.PASS, seconds=1.5)
    torn = json.dumps({**kept.to_dict(), "case_id": "flux/ulysses2/native/fp32/tensor"})[:40]
    header = json.dumps({"fingerprint": "abc"})
    (tmp_path / runner.PARTIAL).write_text(header + "\n" + json.dumps(kept.to_dict()) + "\n\n" + torn)
    done = partial.resume(tmp_path, asked=True, fingerprint="abc")
    assert list(done) == [kept.case_id]
    assert done[kept.case_id].status is Status.PASS and done[kept.case_id].seconds == 1.5


def test_resume_refuses_a_run_made_under_other_options_versions_or_references(tmp_path):
    """Kept verdicts are only this run's verdicts when nothing they depend on changed."""
    from harness.core.errors import HarnessError

    (tmp_path / runner.PARTIAL).write_text(json.dumps({"fingerprint": "from-another-run"}) + "\n")
    with pytest.raises(HarnessError, match="cannot --resume the run in .*: its options, diffusers/torch versions or "
                                           "references differ"):
        partial.resume(tmp_path, asked=True, fingerprint="this-run")


# ------------------------------------------------------------------------------------------ concurrent capture


@pytest.mark.slow
def test_two_captures_at_once_write_each_reference_once_and_whole(project):
    from harness.catalogue.zoo import get_spec
    from harness.core.reference import read_reference, reference_path

    command = [sys.executable, "-m", "harness", "capture", "--models", "qwenimage", "--kinds", "tensor"]
    processes = [subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [process.communicate(timeout=900) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    spec = get_spec("qwenimage")
    paths = [reference_path(project / "references", spec.name, shape) for shape in spec.shapes]
    lines = [line for out, _ in outputs for line in out.splitlines()]
    for path in paths:
        assert read_reference(path, spec.config_hash()).output.isfinite().all()
        said = sorted(line.split()[0] for line in lines if line.endswith(str(path)))
        assert said == ["captured", "kept"], lines  # written by exactly one of them, kept by the other
    assert sorted(p.name for p in (project / "references/qwenimage").iterdir()) == sorted(p.name for p in paths)


# ---------------------------------------------------------------------------------------------------- xdist

XDIST_PROJECT = '''[tool.harness]
modes = ["eager"]
loads = ["enable"]
flows = ["none"]
models = ["flux"]
layouts = ["ulysses2", "tp2"]
backends = ["native"]
dtypes = ["fp32"]
kinds = ["tensor"]
references = {references!r}
cpu_max_ranks = 2
case_timeout = 600
'''


@pytest.mark.slow
def test_xdist_runs_the_same_matrix_once_on_one_worker(pytester, zoo_references):
    pytester.makefile(".toml", pyproject=XDIST_PROJECT.format(references=str(zoo_references)))
    pytester.makepyfile(test_matrix="from harness.plugin import check_parity, check_reference\n\n\n"
                                    "def test_reference(captured_reference):\n    check_reference(captured_reference)\n"
                                    "\n\ndef test_parity(parity_case, parity_results):\n"
                                    "    check_parity(parity_case, parity_results)\n")
    from harness.run.folders import pytest_report_folder

    reports = pytest_report_folder(pytester.path / "reports")  # the parity items' own (`harness run` uses reports/)

    serial = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    serial.assert_outcomes(passed=2, deselected=1)  # test_reference: only with --ref
    expected = {cid: case["status"] for cid, case in _results(reports).items()}
    assert expected["flux/ulysses2/native/fp32/tensor"] == expected["flux/tp2/native/fp32/tensor"] == "PASS"
    shutil.rmtree(reports)

    parallel = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", "-n", "2")
    parallel.assert_outcomes(passed=2)  # xdist does not count the deselected
    assert {cid: case["status"] for cid, case in _results(reports).items()} == expected
    workers = set(re.findall(r"\[(gw\d)\] .*(?:PASSED|FAILED|SKIPPED|ERROR) test_matrix.py::test_parity\[",
                             parallel.stdout.str()))
    assert len(workers) == 1, parallel.stdout.str()  # one worker ran the matrix: nobody else wrote its files
    assert [p.relative_to(pytester.path) for p in pytester.path.rglob("results*.json*")] == \
        [(reports / "results.json").relative_to(pytester.path)]


# ------------------------------------------------------------------------ cross-version: a change to diffusers


ROPE = ["flux/ulysses2/native/fp32/tensor+rope_sign", "flux/tp2/native/fp32/tensor+rope_sign"]


@pytest.mark.slow
def test_a_changed_model_against_references_of_another_version(project, zoo_references, rewrite_meta):
    """References that say they come from another diffusers, and a run whose Flux RoPE turns the other way in every
    run (the single-device baseline included): what a regression in diffusers itself looks like."""
    import diffusers

    reference = project / "references/flux/tensor.safetensors"
    reference.parent.mkdir(parents=True)
    shutil.copy(zoo_references / "flux/tensor.safetensors", reference)
    rewrite_meta(reference, lambda meta: meta.update(diffusers="0.0.1-old"))
    done = _harness("run", *FLUX_2, "--layouts", "ulysses2,tp2", "--inject-fault", "rope_sign",
                    "--case-timeout", "600", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr

    note = f"references come from another version: diffusers 0.0.1-old (references) vs {diffusers.__version__} " \
           "(this run)"
    lines = done.stdout.splitlines()
    said = [i for i, line in enumerate(lines) if line == f"note: {note}"]
    cases = [i for i, line in enumerate(lines) if re.match(r"\[\d+/\d+\] ", line)]
    assert len(said) == 2 and said[0] < cases[0] and said[1] > cases[-1], done.stdout
    assert f"> {note}" in (project / "reports/matrix.md").read_text()
    assert f"Reference mismatch: {note}" in (project / "reports/index.html").read_text()

    results = _results(project / "reports")
    for cid in ROPE:
        assert results[cid]["status"] == "FAIL"
        assert re.fullmatch(r"max abs err \S+ > tolerance 1e-05", results[cid]["reason"]), results[cid]["reason"]
        assert figure(results[cid], "max_abs_err") > 100 * limit(results[cid]["figures"], "max_abs_err")
    # ... while the layouts agree with each other and with the changed model's single-device run
    ulysses, tp = (results[cid] for cid in ROPE)
    assert figure(ulysses, "vs_baseline_max_abs") < 1e-5 and figure(tp, "vs_baseline_max_abs") < 1e-5
    assert abs(figure(ulysses, "max_abs_err") - figure(tp, "max_abs_err")) < 1e-5
    assert abs(figure(ulysses, "mean_abs_err") - figure(tp, "mean_abs_err")) < 1e-6


def figure(case: dict, name: str):
    return value(case["figures"], name)


def test_a_fail_keeps_how_far_the_layout_is_from_its_single_device_run():
    from harness.core.records import CaseRecord, Outcome
    from harness.run.verdict import judge
    from tests.judging import settings

    metrics = {"max_abs_err": 1.85e-2, "mean_abs_err": 2e-3, "max_rel_err": 1.0, "nonfinite": 0,
               "vs_baseline_max_abs": 1.2e-7}
    case = Case("flux", parse_layout("ulysses2"), "native", "fp32", fault="rope_sign")
    record = CaseRecord(case.case_id, seconds=0.2, dispatched={"native": 4}, metrics=metrics)
    result = judge(Outcome(case, record), settings())
    assert result.status is Status.FAIL and "> tolerance" in result.reason
    assert result.figure("vs_baseline_max_abs") == 1.2e-7, result.figures


def test_an_error_of_a_rank_ahead_of_rank_0_is_timed_from_when_rank_0_reaches_the_case(tmp_path, monkeypatch):
    """Found under load: rank 1 raised in the next case while rank 0 still judged the last one; 5 s later rank 0
    began that case, the launcher counted the grace from rank 1's error, stopped the group and blamed the case
    after it. The grace counts from the later of the error and rank 0's start, on a clock of the test's own."""
    from harness.core.events import RankError, Start
    from harness.run import launch

    clock = [1000.0]
    monkeypatch.setattr(launch, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    watch = launch._Watch(tmp_path, 2)
    watch._on(Start(0, 0.0, "a"))
    watch._on(RankError(1, 0.0, "b", "ValueError: refused"))  # rank 1 is a case ahead of rank 0
    assert watch.error_unanswered_for() == 0.0  # not the case in flight
    clock[0] += 60
    watch._on(Start(0, 0.0, "b"))  # a minute later rank 0 begins it
    assert watch.error_unanswered_for() == 0.0
    clock[0] += launch.RANK_ERROR_GRACE_S + 1  # and then gives no result
    assert watch.error_unanswered_for() == launch.RANK_ERROR_GRACE_S + 1
    assert watch.blocked_for() == float("inf")  # no rank's CPU time to read: the error alone decides


def test_a_rank_that_dies_a_case_ahead_of_rank_0_is_blamed_on_its_own_case(tmp_path):
    """Found under load: after a case's last collective rank 0 still judges it while rank 1 begins the next, where it
    aborted; the launcher blamed the case rank 0 was judging (a clean case ERROR, then held for a rerun where the
    same happened again). The case a dead rank had begun is the one its death ends."""
    from harness.core.events import Problem, Start
    from harness.core.records import GroupSpec
    from harness.run import launch

    judged, next_one = _case("flux", "ulysses2"), _case("flux", "tp2")
    group = GroupSpec(str(tmp_path), "references", None, [judged, next_one])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # its pid is no process once it has ended
    gone.wait()
    run = launch._Launch(group, tmp_path, 60.0, lambda outcome: None)
    run.watch.pids = {0: os.getpid(), 1: gone.pid}
    for rank in (0, 1):
        run.watch._on(Start(rank, 0.0, judged.case_id))
    assert run._in_flight(Problem.RANK_DIED) == judged.case_id  # rank 1 died in the case rank 0 is in
    run.watch._on(Start(1, 0.0, next_one.case_id))
    assert run._in_flight(Problem.RANK_DIED) == next_one.case_id  # rank 1 died a case ahead
    assert run._in_flight(Problem.HUNG) == judged.case_id  # any other problem: rank 0's case
