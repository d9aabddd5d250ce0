"""One virtual environment per revision (venv + pip), cached and reused, keyed by what went into it.

An environment holds the same torch as this one (`torch==<this version>`, or the requirement in HARNESS_TORCH, as
the noxfile takes it; the torch it got is checked against this one's), the revision's diffusers with its
dependencies, the harness's other dependencies and the packages its flows need (peft), and the harness checkout
that built it installed editable without dependencies (so the pinned diffusers stays; a run in it puts the asking
checkout's harness first on its path: harness.versions.sides). The key is a hash of: the Python version, the torch
version and requirement, the diffusers requirement (a release) or the git tree of its source (a checkout), the
flows' packages, and the harness's requirements (from its pyproject.toml; its settings there install nothing). An
environment counts as built only once its marker file is written, last: one left half-built by an interrupted build
is removed and built again. A lock file keeps two builds of the same key from running at once.

A checkout is built from a detached `git worktree` of its commit inside the cache, installed non-editable (the
user's checkout can change under an editable install), and the worktree is removed again afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import HarnessError
from harness.versions.revisions import Revision, git

FORMAT = 1  # bump when the way an environment is built changes: every key changes with it
CACHE_ENV = "HARNESS_ENV_CACHE"
TORCH_ENV = "HARNESS_TORCH"
MARKER = "harness-env.json"
_PROBE = ("import importlib.metadata as m, importlib.util as u, json; "
          "print(json.dumps({'torch': m.version('torch'), 'diffusers': m.version('diffusers'), "
          "'diffusers_at': u.find_spec('diffusers').origin}))")

Runner = Callable[[list[str], Path], subprocess.CompletedProcess]


@dataclass
class Env:
    """Where a revision's harness runs: `python -m harness ...` with this interpreter."""

    revision: Revision
    python: Path
    folder: Path | None = None  # None: this environment (`installed`)
    built_s: float | None = None  # seconds it took to build now; None: reused (or installed)
    info: dict = field(default_factory=dict)  # torch, diffusers, diffusers_at, key, material

    def harness(self, *args: str) -> list[str]:
        return [str(self.python), "-m", "harness", *args]


def cache_root(given: str | None = None) -> Path:
    """`--env-cache`, else $HARNESS_ENV_CACHE, else ~/.cache/diffusers-parity-harness (XDG_CACHE_HOME honoured)."""
    if given or os.environ.get(CACHE_ENV):
        return Path(given or os.environ[CACHE_ENV]).expanduser().resolve()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "diffusers-parity-harness"


def harness_root() -> Path:
    """The harness checkout every environment installs (editable): this package's own."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise HarnessError(f"the harness at {root} is not a checkout with its pyproject.toml: environments for other "
                           "revisions install the harness from its checkout (pip install -e)")
    return root


def torch_requirement() -> str:
    return os.environ.get(TORCH_ENV) or f"torch=={_torch_version().split('+')[0]}"


def _torch_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("torch")


def key_material(revision: Revision) -> dict:
    return {"format": FORMAT, "python": f"{sys.implementation.name} {platform.python_version()}",
            "torch": _torch_version(), "torch_requirement": torch_requirement(),
            "harness_requirements": _requirements_hash(), "flow_packages": flow_packages(),
            **revision.key_material()}


def _requirements_hash() -> str:
    """What of the harness's pyproject.toml goes into an environment: its requirements (the harness's code is
    installed editable, and the rest of the file, its settings and markers, installs nothing)."""
    project = tomllib.loads((harness_root() / "pyproject.toml").read_text())["project"]
    payload = json.dumps({"dependencies": sorted(project["dependencies"]),
                          "requires-python": project.get("requires-python")})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def env_key(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def env_for(revision: Revision, cache: Path, echo: Callable[[str], None] = print, run: Runner | None = None) -> Env:
    """The revision's environment: reused when one with the same key is complete, else built now."""
    if revision.source == "installed":
        return Env(revision, Path(sys.executable), info={"key": "installed"})
    material = key_material(revision)
    key = env_key(material)
    folder = cache / "envs" / f"{revision.slug}-{key}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.parent / f"{folder.name}.lock"):
        marker = folder / MARKER
        if marker.is_file():
            echo(f"env: reusing {folder} for {revision.label}")
            return Env(revision, folder / "bin" / "python", folder, info=json.loads(marker.read_text()))
        if folder.exists():
            echo(f"env: {folder} was left half-built; building it again")
            shutil.rmtree(folder)
        echo(f"env: building {folder} for {revision.label} (torch {material['torch']}, python "
             f"{platform.python_version()}); its log: {folder / 'build.log'}")
        started = time.monotonic()
        info = _build(folder, revision, cache, run or _run)
        info.update(key=key, material=material)
        marker.write_text(json.dumps(info, indent=1))  # last: only now is the environment complete
        env = Env(revision, folder / "bin" / "python", folder, round(time.monotonic() - started, 1), info)
        echo(f"env: built in {env.built_s:.0f} s: diffusers {info['diffusers']}, torch {info['torch']}")
        return env


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(folder: Path, revision: Revision, cache: Path, run: Runner) -> dict:
    folder.mkdir(parents=True)
    log = folder / "build.log"
    _step(run, [sys.executable, "-m", "venv", str(folder)], log, revision, "create the venv")
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    _step(run, [*pip, torch_requirement()], log, revision, f"install {torch_requirement()}")
    with _source(revision, cache) as diffusers:
        _step(run, [*pip, diffusers, *harness_dependencies(), *flow_packages()], log, revision,
              f"install {diffusers}")
    _step(run, [*pip, "--no-deps", "-e", str(harness_root())], log, revision, "install the harness")
    probe = _step(run, [str(folder / "bin" / "python"), "-c", _PROBE], log, revision, "read its versions")
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    if info["torch"] != _torch_version():
        raise HarnessError(f"the environment for {revision.label} got torch {info['torch']}, this one has "
                           f"{_torch_version()}: set {TORCH_ENV} to a requirement that installs {_torch_version()}")
    if revision.version is not None and info["diffusers"] != revision.version:
        raise HarnessError(f"the environment for {revision.label} got diffusers {info['diffusers']}")
    return info


def flow_packages() -> list[str]:
    """What the flows need besides diffusers (their `needs`: peft for the LoRA flows), as pip names: a revision's
    flow cases must run there as here, not SKIP for a package its environment lacks."""
    from harness import flows

    needs = {need for flow in flows.REGISTERED.values() for need in flow.needs}
    return sorted(need.replace(".", "-") for need in needs if need.split(".")[0] != "diffusers")  # the revision's own


def harness_dependencies() -> list[str]:
    """The harness's own requirements less torch and diffusers (those two are the revision's)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((harness_root() / "pyproject.toml").read_text())["project"]
    return [item for item in project["dependencies"] if Requirement(item).name not in ("torch", "diffusers")]


@contextlib.contextmanager
def _source(revision: Revision, cache: Path) -> Iterator[str]:
    """What pip installs diffusers from: the release's requirement, or a detached worktree of the checkout's commit
    (removed again afterwards, so the user's repository keeps no worktree of ours)."""
    if revision.source == "release":
        yield f"diffusers=={revision.version}"
        return
    folder = cache / "src" / f"{revision.tree[:12]}-{os.getpid()}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    git(revision.repo, "worktree", "add", "--detach", str(folder), revision.commit,
        fail=f"cannot check out {revision.commit} of {revision.repo} into {folder}")
    try:
        yield str(folder)
    finally:
        subprocess.run(["git", "-C", str(revision.repo), "worktree", "remove", "--force", str(folder)],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["git", "-C", str(revision.repo), "worktree", "prune"], capture_output=True)


def _step(run: Runner, command: list[str], log: Path, revision: Revision, what: str) -> subprocess.CompletedProcess:
    with open(log, "a") as handle:
        handle.write(f"$ {' '.join(command)}\n")
    done = run(command, log)
    if done.returncode != 0:
        said = _last_error(log)
        raise HarnessError(f"could not build the environment for {revision.label}: {what} failed"
                           + (f" ({said})" if said else "") + f"; log: {log}")
    return done


def _run(command: list[str], log: Path) -> subprocess.CompletedProcess:
    """Run one build step, its output appended to the log (stdout also returned, for the probe)."""
    done = subprocess.run(command, capture_output=True, text=True)
    with open(log, "a") as handle:
        handle.write(done.stdout + done.stderr)
    return done


def _last_error(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR") or "error" in line.lower()]
    return (errors or lines or [""])[-1][:300]
