"""The diffusers commit is reported only for a diffusers source checkout, never for the repository a venv sits in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.core.environment import diffusers_commit


def _repo(folder: Path) -> str:
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    (folder / "README").write_text("x")
    run = {"cwd": folder, "check": True, "capture_output": True}
    subprocess.run(["git", "add", "README"], **run)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"], **run)
    return subprocess.run(["git", "rev-parse", "HEAD"], text=True, **run).stdout.strip()


def test_a_wheel_inside_another_repository_has_no_commit(tmp_path):
    """The README's `.venv` lives inside the harness checkout: git finds the harness's repository there."""
    _repo(tmp_path)
    package = tmp_path / ".venv/lib/python3.11/site-packages/diffusers"
    package.mkdir(parents=True)
    assert diffusers_commit(package) is None


def test_an_editable_diffusers_checkout_reports_its_commit(tmp_path):
    head = _repo(tmp_path)
    package = tmp_path / "src/diffusers"
    package.mkdir(parents=True)
    assert diffusers_commit(package) == head


def test_outside_any_repository_there_is_no_commit(tmp_path):
    package = tmp_path / "diffusers"
    package.mkdir()
    assert diffusers_commit(package) is None
