"""What the GPU machine installs, and where it comes from, asked of the package registry through pip alone.

A GPU machine may reach the registry or not. Torch is never carried to it: a CUDA build is gigabytes, so the check
uses the machine's own torch when it is a CUDA build, and installs one from the registry only when it is not (and
the registry answers). Everything else it needs is small, so `check.sh --prepare` downloads it here into a
wheelhouse that travels with the working tree, and the GPU machine installs from there when it has no registry.

Standard library only: the GPU run imports this before anything else is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WHEELHOUSE = HERE / "wheelhouse"
MANIFEST = "MANIFEST.json"

# The registry path's torch: the version every CPU figure of this project comes from (noxfile.TORCH, .ci/run; a unit
# test keeps them equal). Asked for without a local version, the registry's Linux wheel is its CUDA build.
TORCH = "torch==2.13.0"
# The GPU machine's Python, for which the wheels are chosen (`--python-version`).
GPU_PYTHON = "3.12"
# pip matches a wheel's platform tag exactly, so each glibc level wheels are commonly tagged with is named (every
# level from 5 to 39 makes pip several times slower on torch's long list of files, for no wheel found here).
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17, 5)), "manylinux2014_x86_64",
             "manylinux1_x86_64", "linux_x86_64")
# Packages a diffusers backend names that are not CUDA packages: never installed by a CUDA check.
NOT_CUDA = {"torch_npu": "Ascend NPUs", "torch_xla": "TPUs (XLA)", "torch-npu": "Ascend NPUs", "torch-xla": "TPUs"}
# Packages that need the network at run time as well (a hub kernel is downloaded when a backend is first set): only
# worth installing where the registry, and so presumably the hub, is reachable.
NEEDS_NETWORK = {"kernels": "downloads its kernels from the Hugging Face Hub when a backend is set"}
# What one copy sent to a lent GPU machine may hold in all (tracked files, untracked ones, carried paths).
CARRY_LIMIT_MIB = 64
# A dependency of a required package is carried when its wheel is at most this big; bigger ones (numpy, Pillow,
# hf-xet) are left to the machine, which has them wherever torch and transformers are installed.
DEPENDENCY_MIB = 2.0


@dataclass(frozen=True)
class Package:
    """One thing the GPU run may install: `spec` as pip takes it, why, and how much it matters."""

    name: str
    spec: str
    why: str
    required: bool = True  # the check cannot run without it: a registry that lacks it fails the dry run
    carried: bool = True  # goes into the wheelhouse (small); False: only from the registry
    backends: tuple[str, ...] = ()


@dataclass
class Found:
    """What the registry answered for one package: the wheel pip would take for the GPU platform, or why none."""

    package: Package
    wheel: str | None = None
    version: str | None = None
    requires: list[str] = field(default_factory=list)
    problem: str | None = None  # None: a wheel was found
    exists: bool = True  # False: the registry has no project of that name at all

    def to_dict(self) -> dict:
        return {**asdict(self.package), "wheel": self.wheel, "version": self.version, "requires": self.requires,
                "problem": self.problem, "exists": self.exists}


def pip(args: list[str], timeout: float, python: str | None = None) -> subprocess.CompletedProcess:
    """pip of `python` (this interpreter by default), never asking questions; a timeout is an answer too."""
    command = [python or sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"pip {args[0]}: no answer within {timeout:.0f}s")


def last_line(process: subprocess.CompletedProcess) -> str:
    """pip's own last words, without its config warnings about missing local folders."""
    lines = [line.strip() for line in (process.stderr + "\n" + process.stdout).splitlines()
             if line.strip() and not line.startswith("WARNING: Location") and "experimental" not in line]
    return lines[-1] if lines else f"exit {process.returncode}"


def reachable(python: str | None = None, timeout: float = 30.0) -> tuple[bool, str]:
    """Whether the registry answers at all: a name that certainly exists (diffusers) is looked up."""
    process = pip(["index", "versions", "diffusers", "--retries", "0", "--timeout", "10"], timeout, python)
    if process.returncode == 0:
        return True, "the registry answers"
    return False, last_line(process)


def target_options(python_version: str = GPU_PYTHON) -> list[str]:
    """pip options that pick wheels for the GPU machine (x86-64 Linux, CPython `python_version`), not for here."""
    options = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python_version]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


def find(package: Package, python_version: str = GPU_PYTHON, timeout: float = 120.0) -> Found:
    """The wheel pip would install for the GPU platform, from its metadata alone (`--dry-run`: nothing is
    downloaded where the registry serves metadata separately, as it does for torch's multi-GB wheels)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        report = Path(scratch) / "report.json"
        process = pip(["install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet", *target_options(
            python_version), "--target", str(Path(scratch) / "target"), "--report", str(report), package.spec],
            timeout)
        if process.returncode == 0 and report.exists():
            item = json.loads(report.read_text())["install"][0]
            url = item["download_info"]["url"]
            return Found(package, wheel=url.rsplit("/", 1)[-1], version=item["metadata"]["version"],
                         requires=[r for r in item["metadata"].get("requires_dist") or [] if "extra ==" not in r])
    listed = pip(["index", "versions", package.name, "--retries", "1"], timeout)
    if listed.returncode != 0:
        return Found(package, problem=f"not found on the registry ({last_line(process)})", exists=False)
    newest = next((line.split("(", 1)[1].rstrip(")") for line in listed.stdout.splitlines() if "(" in line), "?")
    return Found(package, problem=f"no wheel for CPython {python_version} on x86-64 Linux matches {package.spec} "
                                  f"(newest on the registry: {newest}; only a source build, if any)")


def find_all(packages: list[Package], python_version: str = GPU_PYTHON) -> list[Found]:
    """Every package at once (each answer takes about a second, torch's several)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda package: find(package, python_version), packages))


def tracked_bytes(repo: Path = REPO) -> int:
    """The bytes of the working tree that travel to a GPU machine without being named: git's tracked and untracked,
    not ignored files."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, timeout=60)
    if listed.returncode != 0:
        return 0
    return sum((repo / name).stat().st_size for name in listed.stdout.decode().split("\0")
               if name and (repo / name).is_file())


def read_manifest(folder: Path = WHEELHOUSE) -> dict | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        return None
    missing = [item["wheel"] for item in manifest.get("wheels", []) if not (folder / item["wheel"]).exists()]
    return {**manifest, "missing": missing}


def _project(wheel: str) -> str:
    """A wheel file's project, normalized as pip compares names."""
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


def prepare(required: list[Package], optional: list[Package], python_version: str, folder: Path = WHEELHOUSE,
            limit_mib: float = CARRY_LIMIT_MIB, dependency_mib: float = DEPENDENCY_MIB) -> tuple[dict, list[str]]:
    """The wheelhouse in `folder` (emptied first): `required` with their dependencies, except a dependency whose
    wheel is over `dependency_mib` (numpy, Pillow: a machine with torch has them; the GPU run names one it lacks),
    and `optional` without theirs (xformers would pull in a CUDA torch). Returns its manifest and the problems."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.is_file():
            old.unlink()
    problems, kept, left = [], [], []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        process = pip(["download", "--quiet", *target_options(python_version), "--dest", scratch,
                       *(package.spec for package in required)], 900)
        if process.returncode != 0:
            problems.append(f"{', '.join(p.spec for p in required)}: {last_line(process)}")
        named = {re.sub(r"[-_.]+", "-", package.name).lower() for package in required}
        for wheel in sorted(Path(scratch).glob("*.whl")):
            if _project(wheel.name) in named or wheel.stat().st_size <= dependency_mib * 2**20:
                shutil.move(str(wheel), folder / wheel.name)
            else:
                left.append({"wheel": wheel.name, "bytes": wheel.stat().st_size})
    kept += required if process.returncode == 0 else []
    for package in optional:  # one at a time: a problem then names its package
        process = pip(["download", "--no-deps", "--quiet", *target_options(python_version), "--dest", str(folder),
                       package.spec], 600)
        if process.returncode != 0:
            problems.append(f"{package.spec}: {last_line(process)}")
        else:
            kept.append(package)
    wheels = sorted(folder.glob("*.whl"))
    manifest = {"python_version": python_version, "platform": "x86-64 Linux (manylinux)",
                "packages": [{"name": p.name, "spec": p.spec, "why": p.why, "required": p.required} for p in kept],
                "wheels": [{"wheel": w.name, "bytes": w.stat().st_size} for w in wheels],
                "left_to_the_machine": left}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size, tree = sum(w.stat().st_size for w in wheels), tracked_bytes()
    manifest["bytes"], manifest["tree_bytes"] = size, tree
    if (size + tree) / 2**20 > limit_mib:
        problems.append(f"the wheelhouse ({size / 2**20:.1f} MiB) and the working tree ({tree / 2**20:.1f} MiB) "
                        f"come to {(size + tree) / 2**20:.1f} MiB, over the {limit_mib:g} MiB a copy to a GPU machine "
                        "may carry: leave an optional package out (--without NAME)")
    return manifest, problems


def install(python: str, pins: list[str], target: Path, online: bool, folder: Path = WHEELHOUSE,
            timeout: float = 300.0) -> subprocess.CompletedProcess:
    """pip install the exact `pins` (from `resolve`) into the folder `target`, which the caller puts on PYTHONPATH:
    the machine's own packages stay as they are. From the wheelhouse alone when offline."""
    where = ["--find-links", str(folder)] if folder.is_dir() else []
    return pip(["install", "--quiet", "--upgrade", "--no-deps", "--target", str(target),
                *([] if online else ["--no-index"]), *where, *pins], timeout, python)


def resolve(python: str, specs: list[str], online: bool, ignore_installed: bool = False, folder: Path = WHEELHOUSE,
            env: dict | None = None, timeout: float = 300.0) -> tuple[list[str], str | None]:
    """What pip would install for `specs` into the environment of `python`, as exact `name==version` pins: the
    resolver sees what that Python already has (the machine's torch stays), or nothing with `ignore_installed`.
    Returns the pins (empty: all satisfied) and pip's complaint, if it could not resolve."""
    where = ["--find-links", str(folder)] if folder.is_dir() else []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        report = Path(scratch) / "report.json"
        command = [python, "-m", "pip", "--disable-pip-version-check", "--no-input", "install", "--dry-run", "--quiet",
                   "--report", str(report), *([] if online else ["--no-index"]),
                   *(["--ignore-installed"] if ignore_installed else []), *where, *specs]
        try:
            process = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return [], f"pip could not resolve {', '.join(specs)} within {timeout:.0f}s"
        if process.returncode != 0 or not report.exists():
            return [], last_line(process)
        items = json.loads(report.read_text())["install"]
    return [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in items], None
