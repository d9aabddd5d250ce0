"""`scripts/setup.sh` as the README's two commands run it: two terminals at once, in one fresh clone. A stand-in for
`python3` (and for the venv's python it makes) logs each `pip install` and holds it open until the test opens a gate,
so the second setup is started while the first is inside pip, without a network or a real install. Nothing here
asserts on wall time; the waits below only bound a hang."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup.sh"
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit; fi
if [ "$1 $2 $3" = "-m pip install" ]; then
    echo "$CALLER start ${*: -1}" >> "$LOG"
    while [ ! -e "$GATE" ]; do sleep 0.05; done
    echo "$CALLER end ${*: -1}" >> "$LOG"
    exit
fi
exit 2
"""
INSTALLS = ["torch==2.13.0", ".[dev]"]


def _clone(tmp_path: Path, script: str) -> Path:
    """A fresh clone as far as setup.sh sees one: the script and a pyproject.toml, and the stand-in python3."""
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "scripts" / "setup.sh").write_text(script)
    (clone / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "bin" / "python3").chmod(0o755)
    return clone


def _start(tmp_path: Path, clone: Path, caller: str) -> subprocess.Popen:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "CALLER": caller,
           "LOG": str(tmp_path / "pip.log"), "GATE": str(tmp_path / "gate")}
    with open(tmp_path / f"{caller}.err", "w") as stderr:  # the child keeps its own copy of the file
        return subprocess.Popen(["bash", "scripts/setup.sh"], cwd=clone, env=env, stderr=stderr)


def _log(tmp_path: Path) -> list[str]:
    path = tmp_path / "pip.log"
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(predicate, what: str) -> None:
    """Until `predicate()` holds; the bound only keeps a broken script from hanging the suite."""
    deadline = time.monotonic() + 300
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def _overlapping(log: list[str]) -> bool:
    """Some `pip install` started while another caller's was still running."""
    inside: set[str] = set()
    for line in log:
        caller, event, _ = line.split(" ", 2)
        if event == "start" and inside - {caller}:
            return True
        (inside.add if event == "start" else inside.discard)(caller)
    return False


def _two_at_once(tmp_path: Path, script: str, second_started) -> tuple[list[str], str, list[int]]:
    """Setup A is held inside its first pip; setup B starts; once `second_started` says B got going, the gate opens
    and both finish. The pip log, B's stderr and both exit codes."""
    clone = _clone(tmp_path, script)
    first = _start(tmp_path, clone, "A")
    _wait_for(lambda: _log(tmp_path)[:1] == ["A start torch==2.13.0"], "A inside its first pip")
    second = _start(tmp_path, clone, "B")
    _wait_for(lambda: second_started(tmp_path), "B started")
    (tmp_path / "gate").touch()
    codes = [first.wait(timeout=300), second.wait(timeout=300)]
    return _log(tmp_path), (tmp_path / "B.err").read_text(), codes


def test_two_setups_at_once_install_one_at_a_time_and_both_succeed(tmp_path):
    waiting = "another setup is installing into .venv; waiting for it to finish"
    log, said, codes = _two_at_once(tmp_path, SETUP.read_text(), lambda t: waiting in (t / "B.err").read_text())
    assert codes == [0, 0], said
    assert log == [f"A {event} {what}" for what in INSTALLS for event in ("start", "end")]  # B installed nothing
    assert not _overlapping(log)
    assert "already set up" in said
    again = _start(tmp_path, tmp_path / "clone", "C")
    assert again.wait(timeout=300) == 0 and _log(tmp_path) == log  # set up already: nothing installed again


def test_without_the_lock_two_setups_interleave_their_installs(tmp_path):
    """The negative control: the same script less its flock, started the same way, runs both pips at once."""
    script = SETUP.read_text()
    assert "if ! flock -n 9; then" in script and "    flock 9\n" in script
    unlocked = script.replace("if ! flock -n 9; then", "if false; then").replace("    flock 9\n", "")
    log, said, codes = _two_at_once(tmp_path, unlocked, lambda t: any(line.startswith("B start") for line in _log(t)))
    assert codes == [0, 0], said
    assert _overlapping(log)


def test_a_changed_pyproject_installs_again(tmp_path):
    clone = _clone(tmp_path, SETUP.read_text())
    (tmp_path / "gate").touch()
    assert _start(tmp_path, clone, "A").wait(timeout=300) == 0
    (clone / "pyproject.toml").write_text('[project]\nname = "demo"\ndependencies = ["numpy"]\n')
    assert _start(tmp_path, clone, "B").wait(timeout=300) == 0
    assert [line.split(" ", 1)[0] for line in _log(tmp_path) if " start " in line] == ["A", "A", "B", "B"]


def test_the_readme_commands_and_ci_set_up_through_the_script():
    """The README's two commands and CI install only through the script, so the lock covers every install."""
    readme = (REPO / "README.md").read_text()
    commands = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    assert len(commands) == 2 and all(line.startswith("scripts/setup.sh && . .venv/bin/activate && ")
                                      for line in commands)
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/setup.sh" in ci and "pip install" not in ci
