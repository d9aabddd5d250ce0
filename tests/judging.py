"""Settings for judging synthetic records in tests: the project's own, with the limits a test names."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def settings(tolerance: float = 1e-5, budget_factor: float = 1.25, image: dict | None = None, **train):
    """`tolerance` for every dtype of the tensor kind, `image` limits for every dtype, `train_<name>` options."""
    from harness.run.settings import load_settings

    overrides = {"tensor_limits": {dtype: tolerance for dtype in ("fp32", "bf16", "fp16")},
                 "budget_factor": budget_factor, **{f"train_{key}": value for key, value in train.items()}}
    if image is not None:
        overrides["image_limits"] = {dtype: image for dtype in ("fp32", "bf16", "fp16")}
    return load_settings(overrides, start=ROOT)
