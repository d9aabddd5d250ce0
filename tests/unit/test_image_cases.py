"""Image cases end to end: references with PNGs, the image verdict, and real local checkpoints via --weights."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from harness.core import figures
from harness.core.layouts import parse_layout
from harness.core.records import Case, CaseRecord, Outcome
from harness.core.results import Status
from harness.kinds import kind_of
from harness.run.verdict import judge
from tests.judging import settings

pytest.importorskip("transformers", reason="diffusers' pipeline classes need the transformers package")

LIMITS = {"ssim_min": 0.99, "psnr_min": 38.0, "max_abs_err_max": 0.1}


def _policy(tolerance):
    return settings(tolerance, image=LIMITS)


def _image_outcome(dtype="bf16", **metrics):
    perfect = {"ssim": 1.0, "psnr": math.inf, "max_abs_err": 0.0, "mean_abs_err": 0.0, "nonfinite": 0}
    case = Case("flux", parse_layout("ulysses2"), "native", dtype, kind="image")
    return Outcome(case, CaseRecord(case.case_id, dispatched={"native": 4}, seconds=0.1,
                                    metrics={**perfect, **metrics}))


# What four single-device bf16 noise draws do to the single-device picture (qwenimage, measured)
DRAWS = {"nudged:1": {"ssim": 0.99955, "psnr": 46.8, "max_abs_err": 0.0273, "mean_abs_err": 2e-3, "nonfinite": 0},
         "math_kernel": {"ssim": 0.99960, "psnr": 47.5, "max_abs_err": 0.0234, "mean_abs_err": 2e-3, "nonfinite": 0}}


def test_image_within_limits_against_reference_and_baseline_passes():
    good = {"ssim": 0.9993, "psnr": 49.5, "max_abs_err": 0.017, "mean_abs_err": 2e-3, "nonfinite": 0}
    result = judge(_image_outcome(**good, baseline=good, vs_baseline=good, noise=DRAWS, noise_errors={}),
                   _policy(0.1))
    assert result.status is Status.PASS
    assert (result.figure("ssim"), result.figure("psnr"), figures.cell(result.figures)) == (0.9993, 49.5, "ssim 0.9993")
    # decided by its SSIM against the same-dtype picture: a deficit of 0.0007 where the draws allow 2 x 0.00045
    assert result.cell == "ssim 1-dev 0.78x" and result.deciding["bound"] == ">="
    assert result.figure("noise_max_abs") == 0.0273


def test_image_that_only_the_baseline_comparison_catches_fails():
    # Close enough to the fp32 picture, but off the bf16 single-device picture by more than twice what its noise
    # draws move it (the fixed limits, 0.99 SSIM and 0.1 max, would have let it through).
    good = {"ssim": 0.995, "psnr": 40.0, "max_abs_err": 0.05, "mean_abs_err": 5e-3, "nonfinite": 0}
    off = {"ssim": 0.9985, "psnr": 45.0, "max_abs_err": 0.07, "mean_abs_err": 6e-3, "nonfinite": 0}
    result = judge(_image_outcome(**good, baseline=good, vs_baseline=off, noise=DRAWS, noise_errors={}),
                   _policy(0.1))
    assert result.status is Status.FAIL
    assert result.reason.startswith("vs single-device bf16: ssim 0.99850 < 0.9991")
    assert {item["check"] for item in result.evidence} == {"ssim", "max_pixel_err"}


def test_image_noise_limits_come_from_the_draws_with_no_floor():
    from harness.kinds.image import noise_limits

    limits = noise_limits(DRAWS.values(), 2.0)
    assert limits["max_abs_err_max"] == pytest.approx(0.0546)
    assert limits["ssim_min"] == pytest.approx(1 - 2 * 0.00045)
    assert limits["psnr_min"] == pytest.approx(46.8 - 20 * math.log10(2))


def test_nan_image_fails():
    bad = {"ssim": -1.0, "psnr": -math.inf, "max_abs_err": math.inf, "mean_abs_err": math.inf, "nonfinite": 12}
    result = judge(_image_outcome("fp32", **bad), _policy(1e-5))
    assert result.status is Status.FAIL and "12 non-finite" in result.reason


def test_capture_writes_picture_and_png(tmp_path):
    from harness.core.reference import read_reference

    capture_image = kind_of("image").capture
    path, written = capture_image("flux", "default", tmp_path)
    assert written and path.name == "image.safetensors"
    assert path.with_suffix(".png").stat().st_size > 0
    reference = read_reference(path)
    assert reference.output.shape == (64, 64, 3)
    assert any(key.startswith("transformer.") for key in reference.weights)
    assert any(key.startswith("vae.") for key in reference.weights)
    assert capture_image("flux", "default", tmp_path) == (path, False)  # kept, not overwritten


@pytest.mark.slow
def test_local_checkpoint_runs_the_same_cases(project):
    """A user's checkpoint folder (here a tiny one written by `save_pretrained`) gives the same matrix."""
    import torch

    from harness.catalogue.pipelines import build_pipeline

    folder = project / "checkpoints" / "tiny-flux"
    build_pipeline("flux", torch.float32).save_pretrained(folder)
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--weights", str(folder), "--kinds", "image", "--models", "flux",
         "--layouts", "single,ulysses2", "--backends", "native", "--dtypes", "fp32", "--images", "all"],
        cwd=project, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    frame = pd.read_csv(project / "reports/matrix.csv", keep_default_na=False)
    assert frame.case_id.tolist() == ["flux@tiny-flux/single/native/fp32/image",
                                      "flux@tiny-flux/ulysses2/native/fp32/image"]
    assert frame.status.tolist() == ["PASS", "PASS"]
    assert (frame.ssim > 0.9999).all()
    reference = project / "references/flux/image@tiny-flux.safetensors"
    assert reference.exists() and reference.stat().st_size < 200_000  # the checkpoint's weights stay in its folder
    images = sorted(p.name for p in (project / "reports/images").iterdir())
    assert "flux_tiny-flux_ulysses2_native_fp32_image-diff.png" in images


def test_bad_weights_folder_is_a_clear_error(project):
    (project / "empty").mkdir()
    done = subprocess.run([sys.executable, "-m", "harness", "capture", "--weights", str(project / "empty"),
                           "--kinds", "image", "--models", "flux"], cwd=project, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 2
    assert "has no model_index.json; give the folder of a diffusers pipeline" in done.stderr


def test_image_arrays_round_trip_through_png(tmp_path):
    from PIL import Image

    from harness.rank.image_metrics import to_png

    picture = np.linspace(0, 1, 8 * 8 * 3, dtype=np.float32).reshape(8, 8, 3)
    path = to_png(picture, tmp_path / "p.png")
    assert np.abs(np.asarray(Image.open(path)) / 255.0 - picture).max() <= 0.5 / 255 + 1e-6


@pytest.mark.parametrize(("dtype", "roles", "diff_level"), [
    ("bf16", ["reference", "baseline", "candidate", "diff", "ssim_map"], 0),  # vs its own one-device picture
    ("fp32", ["reference", "candidate", "diff", "ssim_map"], 128),  # the control: vs the fp32 reference
])
def test_the_pictures_show_what_the_parity_check_compares_with(tmp_path, dtype, roles, diff_level):
    """A bf16 candidate equal to its one-device bf16 picture and 0.05 off the fp32 one: its pictures hold the bf16
    picture it is compared with and a black difference to it; an fp32 case's difference is to the reference
    (0.05 x 10 = half brightness). The images block captions each and gives the difference its scale."""
    from types import SimpleNamespace

    import torch
    from PIL import Image

    from harness.kinds.image import _images_block

    expected, own = np.full((16, 16, 3), 0.45, np.float32), np.full((16, 16, 3), 0.5, np.float32)
    expected[:8] = own[:8] = 0.2  # some structure for the SSIM
    case = SimpleNamespace(dtype=dtype, case_id=f"flux/ulysses2/native/{dtype}/image")
    metrics = kind_of("image").measure(own.copy(), SimpleNamespace(output=torch.from_numpy(expected)), own.copy(),
                                       case, tmp_path / "images", {"draw": own.copy()})
    paths = metrics["images"]
    assert list(paths) == roles
    diff = np.asarray(Image.open(tmp_path / paths["diff"]))
    assert np.abs(diff[12, 12].astype(int) - diff_level).max() <= 1 and diff[2, 2].max() == 0
    block = _images_block(paths, dtype)
    assert list(block["captions"]) == roles and block["scales"]["diff"]["ticks"] == ["0", "0.05", "\u2265 0.1"]
    compared = "one device, bf16" if dtype == "bf16" else "the fp32 reference"
    assert block["captions"]["diff"] == f"difference to {compared}, \u00d710"
