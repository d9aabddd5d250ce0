"""What produced a reference or a run: versions, device, and the git commit of an editable diffusers."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch


def diffusers_commit(package_dir: Path | None = None) -> str | None:
    """The commit of a diffusers installed from its own git checkout (`pip install -e ~/diffusers`), else None.

    Only a checkout laid out as diffusers' repository counts (the package at `<top>/src/diffusers`): a wheel in a
    virtual environment that sits inside some other repository (the harness's own `.venv` or `.nox`) must not
    report that repository's commit.
    """
    if package_dir is None:
        import diffusers

        package_dir = Path(diffusers.__file__).parent
    source = Path(package_dir).resolve()
    top = _git(source, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() / "src" / "diffusers" != source:
        return None
    return _git(source, "rev-parse", "HEAD")


def _git(folder: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()})"


def describe() -> dict[str, str | None]:
    import diffusers

    return {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "diffusers_commit": diffusers_commit(),
        "python": platform.python_version(),
        "device": device_name(),
    }
