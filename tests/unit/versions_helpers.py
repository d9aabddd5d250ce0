"""Tiny local stand-ins for the versions tests: a git repository laid out as diffusers' (the package at
src/diffusers), and a git helper that fails loudly."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

# Real releases, each in an environment of its own: opt-in (they take minutes to an hour cold; README has the costs).
OPT_IN = [pytest.mark.slow, pytest.mark.versions,
          pytest.mark.skipif(not os.environ.get("HARNESS_VERSIONS_TESTS"),
                             reason="builds releases' environments: HARNESS_VERSIONS_TESTS=1 or nox -s versions")]

RELEASES = ("0.35.2", "0.36.0", "0.37.0", "0.37.1", "0.38.0", "0.39.0", "0.40.0", "0.41.0", "0.42.0", "0.42.1")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def fake_checkout(folder: Path, versions=("0.1.0",), layout: str = "src/diffusers") -> Path:
    """A git repository with one commit per version, each a package that says its version (a tag per commit)."""
    folder.mkdir(parents=True, exist_ok=True)
    git(folder, "init", "-q", "-b", "main")
    git(folder, "config", "user.email", "test@example.com")
    git(folder, "config", "user.name", "test")
    for version in versions:
        package = folder / layout
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
        (folder / "setup.py").write_text("from setuptools import setup\nsetup()\n")
        git(folder, "add", "-A")
        git(folder, "commit", "-q", "-m", f"release {version}")
        git(folder, "tag", f"v{version}")
    return folder


def state_of(repo: Path) -> tuple[str, str, str, str, str]:
    """What a user's checkout is: HEAD, the branch, the status, the stash and the worktrees."""
    return (git(repo, "rev-parse", "HEAD"), git(repo, "branch", "--show-current"),
            git(repo, "status", "--porcelain"), git(repo, "stash", "list"), git(repo, "worktree", "list"))


def figure_of(case: dict, name: str):
    """A figure's value in a case of results.json (harness.core.figures)."""
    from harness.core.figures import value

    return value(case.get("figures") or [], name)
