"""Picture metrics: identical is perfect, worse is worse, small pictures and videos work, NaN never passes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from harness.rank.image_metrics import (
    diff_image,
    image_metrics,
    scalar_metrics,
    to_png,
    violations,
    win_size,
)


def _picture(height=32, width=32, seed=0) -> np.ndarray:
    """A smooth, structured picture (gradients plus a blob), not white noise."""
    rows, cols = np.mgrid[0:height, 0:width] / max(height, width)
    blob = np.exp(-((rows - 0.4) ** 2 + (cols - 0.6) ** 2) * 20)
    rng = np.random.default_rng(seed)
    return np.clip(np.stack([rows, cols, blob], -1) * 0.8 + 0.1 + rng.normal(0, 0.01, (height, width, 3)), 0, 1)


def test_identical_images_are_perfect():
    image = _picture()
    metrics = image_metrics(image, image.copy())
    assert metrics["ssim"] == pytest.approx(1.0)
    assert metrics["psnr"] == math.inf
    assert metrics["max_abs_err"] == 0.0 and metrics["mean_abs_err"] == 0.0
    assert metrics["nonfinite"] == 0 and metrics["frames"] == 1


def test_larger_perturbation_scores_worse_on_every_metric():
    image = _picture()
    noise = np.random.default_rng(1).normal(0, 1, image.shape)
    small, large = (image_metrics(image + scale * noise, image) for scale in (0.002, 0.05))
    assert 0.9 < small["ssim"] < 1.0 and large["ssim"] < small["ssim"]
    assert small["psnr"] == pytest.approx(10 * math.log10(1 / np.mean((0.002 * noise) ** 2)))
    assert large["psnr"] < small["psnr"]
    assert large["max_abs_err"] > small["max_abs_err"] > 0
    assert large["mean_abs_err"] > small["mean_abs_err"] > 0


def test_half_image_swap_is_caught_by_ssim():
    """The classic broken layout's picture: one half replaced by something else."""
    image = _picture()
    broken = image.copy()
    broken[16:] = _picture(seed=2)[::-1][16:]
    assert image_metrics(broken, image)["ssim"] < 0.9


@pytest.mark.parametrize(("height", "width", "expected"), [(64, 64, 7), (8, 8, 7), (6, 9, 5), (5, 5, 5), (4, 4, 3)])
def test_window_fits_small_images(height, width, expected):
    assert win_size(height, width) == expected
    image = _picture(height, width)
    metrics = image_metrics(image * 0.9, image)
    assert metrics["win_size"] == expected and -1.0 <= metrics["ssim"] < 1.0


def test_too_small_image_is_refused():
    with pytest.raises(ValueError, match="too small"):
        image_metrics(np.zeros((2, 8, 3)), np.zeros((2, 8, 3)))


def test_video_reports_its_worst_frame():
    video = np.stack([_picture(seed=s) for s in range(3)])
    candidate = video.copy()
    candidate[1] = np.clip(candidate[1] + np.random.default_rng(3).normal(0, 0.1, candidate[1].shape), 0, 1)
    candidate[2] += 0.001
    metrics = image_metrics(candidate, video)
    frame1 = image_metrics(candidate[1], video[1])
    assert metrics["frames"] == 3 and metrics["worst_frame"] == 1
    assert metrics["ssim"] == frame1["ssim"] and metrics["psnr"] == frame1["psnr"]
    assert metrics["max_abs_err"] == frame1["max_abs_err"]
    assert metrics["ssim_map"].shape == video.shape[1:]


def test_nonfinite_candidate_fails_everything():
    image = _picture()
    candidate = image.copy()
    candidate[3, 4, 0] = np.nan
    candidate[5, 6, 1] = np.inf
    metrics = image_metrics(candidate, image)
    assert metrics["nonfinite"] == 2
    assert metrics["ssim"] == -1.0 and metrics["psnr"] == -math.inf
    assert metrics["max_abs_err"] == math.inf and metrics["mean_abs_err"] == math.inf
    assert not metrics["ssim"] >= 0.5 and not metrics["psnr"] >= 10 and not metrics["max_abs_err"] <= 1


def test_bad_shapes_and_references_are_refused():
    image = _picture()
    with pytest.raises(ValueError, match="shape"):
        image_metrics(image, image[:16])
    with pytest.raises(ValueError, match="expected"):
        image_metrics(image[..., 0], image[..., 0])
    reference = image.copy()
    reference[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="reference"):
        image_metrics(image, reference)


def _limits():
    """The limits the verdict applies: this repository's `[tool.harness.image]` over the option's defaults."""
    from pathlib import Path

    from harness.run.settings import load_settings

    return load_settings(start=Path(__file__).resolve().parents[2]).option("image_limits")


THRESHOLDS = _limits()


@pytest.mark.parametrize("dtype", sorted(THRESHOLDS))
def test_thresholds_pass_identical_and_fail_nonfinite(dtype):
    image = _picture()
    assert violations(image_metrics(image, image), THRESHOLDS[dtype]) == []
    candidate = image.copy()
    candidate[0, 0, 0] = np.nan
    assert len(violations(image_metrics(candidate, image), THRESHOLDS[dtype])) == 3


def test_violations_name_each_broken_limit():
    limits = {"ssim_min": 0.99, "psnr_min": 38.0, "max_abs_err_max": 0.1}
    found = violations({"ssim": 0.98, "psnr": 40.0, "max_abs_err": 0.2}, limits)
    assert [(check, value, limit) for check, value, limit, _ in found] == [("ssim", 0.98, 0.99),
                                                                           ("max_pixel_err", 0.2, 0.1)]
    assert found[0][3].startswith("ssim 0.98000 < 0.99") and "max pixel error 0.2 > 0.1" in found[1][3]


def test_thresholds_tighten_with_precision():
    fp32, fp16, bf16 = THRESHOLDS["fp32"], THRESHOLDS["fp16"], THRESHOLDS["bf16"]
    assert fp32["ssim_min"] > fp16["ssim_min"] > bf16["ssim_min"]
    assert fp32["psnr_min"] > fp16["psnr_min"] > bf16["psnr_min"]
    assert fp32["max_abs_err_max"] < fp16["max_abs_err_max"] < bf16["max_abs_err_max"]


def test_scalar_metrics_drop_the_map():
    image = _picture()
    assert "ssim_map" not in scalar_metrics(image_metrics(image, image))


def test_diff_image_amplifies_and_flags_nan():
    reference = np.full((4, 4, 3), 0.5)
    candidate = reference.copy()
    candidate[0, 0] = 0.51
    candidate[1, 1, 2] = np.nan
    diff = diff_image(candidate, reference, gain=20)
    assert diff.dtype == np.uint8 and diff.shape == reference.shape
    assert diff[0, 0, 0] == round(0.01 * 20 * 255) and diff[1, 1, 2] == 255 and diff[3, 3, 0] == 0


def _read_png(path) -> np.ndarray:
    with Image.open(path) as png:
        return np.asarray(png)


def test_to_png_writes_images_and_videos(tmp_path):
    image = _picture(8, 12)
    back = _read_png(to_png(image, tmp_path / "a" / "image.png"))
    assert back.shape == (8, 12, 3)
    assert np.abs(back / 255 - image).max() <= 0.5 / 255 + 1e-9
    video = np.stack([image] * 3)
    assert _read_png(to_png(video, tmp_path / "video.png")).shape == (8, 36, 3)
