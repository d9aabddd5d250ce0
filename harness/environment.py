"""What produced a reference or a run: versions, device, and the git commit of an editable diffusers."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch


def diffusers_commit() -> str | None:
    """The commit of a diffusers installed from a git checkout (`pip install -e`), else None."""
    import diffusers

    source = Path(diffusers.__file__).resolve().parent
    try:
        result = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


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
