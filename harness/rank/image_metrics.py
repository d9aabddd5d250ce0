"""Picture metrics: how far a pipeline's image (or video) is from the reference one, as a person would judge it.

Tensor tolerances say little about a picture: bf16 noise and a broken layout can have the same max error, while
one is invisible and the other splits the image in two. SSIM (structure, per 7x7 window) and PSNR (energy of the
error) tell them apart; max and mean absolute pixel error stay for reports.

Images are float arrays in [0, 1], (H, W, C); videos are (F, H, W, C), judged by their worst frame.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DEFAULT_WIN = 7
MIN_WIN = 3  # skimage needs an odd window; with 1 pixel the sample variance divides by zero

def win_size(height: int, width: int, default: int = DEFAULT_WIN) -> int:
    """The largest odd SSIM window <= `default` that fits the picture, so 8x8 or 5x5 images still get an SSIM."""
    size = min(default, height, width)
    size -= 1 - size % 2
    if size < MIN_WIN:
        raise ValueError(f"image {height}x{width} is too small for SSIM (needs at least {MIN_WIN}x{MIN_WIN})")
    return size


def _as_frames(array, name: str) -> np.ndarray:
    frames = np.asarray(array, dtype=np.float64)
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4:
        raise ValueError(f"{name}: expected (H, W, C) or (F, H, W, C), got shape {np.shape(array)}")
    return frames


def image_metrics(candidate, reference) -> dict:
    """SSIM, PSNR (dB, inf when identical), max and mean absolute pixel error of `candidate` against `reference`.

    For a video every number is its worst frame's: min SSIM, min PSNR, max of the per-frame max and mean errors;
    `worst_frame` is the frame with the lowest SSIM and `ssim_map` its (H, W, C) SSIM map, for a picture of where
    it differs. A candidate with NaN or Inf fails every metric outright (ssim -1, psnr -inf, errors inf) and
    reports how many such values in `nonfinite`: a NaN must never compare as "within tolerance".
    """
    cand, ref = _as_frames(candidate, "candidate"), _as_frames(reference, "reference")
    if cand.shape != ref.shape:
        raise ValueError(f"candidate shape {np.shape(candidate)} != reference shape {np.shape(reference)}")
    if not np.isfinite(ref).all():
        raise ValueError("reference image has NaN or Inf values")
    nonfinite = int((~np.isfinite(cand)).sum())
    result = {"frames": cand.shape[0], "nonfinite": nonfinite, "win_size": win_size(*cand.shape[1:3])}
    if nonfinite:
        return {**result, "ssim": -1.0, "psnr": float("-inf"), "max_abs_err": float("inf"),
                "mean_abs_err": float("inf"), "worst_frame": 0, "ssim_map": None}
    per_frame = [_frame_metrics(c, r, result["win_size"]) for c, r in zip(cand, ref, strict=True)]
    worst = int(np.argmin([frame["ssim"] for frame in per_frame]))
    return {
        **result,
        "ssim": per_frame[worst]["ssim"],
        "psnr": min(frame["psnr"] for frame in per_frame),
        "max_abs_err": max(frame["max_abs_err"] for frame in per_frame),
        "mean_abs_err": max(frame["mean_abs_err"] for frame in per_frame),
        "worst_frame": worst,
        "ssim_map": per_frame[worst]["ssim_map"],
    }


def _frame_metrics(candidate: np.ndarray, reference: np.ndarray, win: int) -> dict:
    from skimage.metrics import structural_similarity

    ssim, ssim_map = structural_similarity(candidate, reference, win_size=win, data_range=1.0, channel_axis=-1,
                                           full=True)
    diff = np.abs(candidate - reference)
    mse = float(np.mean(diff**2))
    return {
        "ssim": float(ssim),
        "ssim_map": ssim_map,
        "psnr": float("inf") if mse == 0 else float(10 * np.log10(1.0 / mse)),
        "max_abs_err": float(diff.max()),
        "mean_abs_err": float(diff.mean()),
    }


def violations(metrics: dict, limits: dict) -> list[tuple[str, float, float, str]]:
    """Which limits (`ssim_min`, `psnr_min`, `max_abs_err_max`: the `image` option) the metrics break: (check,
    value, limit, in words) each."""
    broken = []
    if not metrics["ssim"] >= limits["ssim_min"]:
        broken.append(("ssim", metrics["ssim"], limits["ssim_min"],
                       f"ssim {metrics['ssim']:.5f} < {limits['ssim_min']}"))
    if not metrics["psnr"] >= limits["psnr_min"]:
        broken.append(("psnr", metrics["psnr"], limits["psnr_min"],
                       f"psnr {metrics['psnr']:.1f} dB < {limits['psnr_min']} dB"))
    if not metrics["max_abs_err"] <= limits["max_abs_err_max"]:
        broken.append(("max_pixel_err", metrics["max_abs_err"], limits["max_abs_err_max"],
                       f"max pixel error {metrics['max_abs_err']:.3g} > {limits['max_abs_err_max']}"))
    return broken


def scalar_metrics(metrics: dict) -> dict:
    """The metrics without the SSIM map: what goes into a JSON result."""
    return {key: value for key, value in metrics.items() if key != "ssim_map"}


def diff_image(candidate, reference, gain: float = 10.0) -> np.ndarray:
    """|candidate - reference| x `gain` as uint8 (same shape), so a small structured error becomes visible.

    NaN and Inf pixels show at full intensity.
    """
    cand, ref = np.asarray(candidate, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if cand.shape != ref.shape:
        raise ValueError(f"candidate shape {cand.shape} != reference shape {ref.shape}")
    diff = np.nan_to_num(np.abs(cand - ref) * gain, nan=1.0, posinf=1.0)
    return to_uint8(diff)


def to_uint8(array) -> np.ndarray:
    """A [0, 1] float picture as uint8 (values outside clipped, NaN as 0); uint8 input is returned as is."""
    array = np.asarray(array)
    if array.dtype == np.uint8:
        return array
    return np.round(np.clip(np.nan_to_num(array, nan=0.0), 0.0, 1.0) * 255).astype(np.uint8)


def to_png(array, path) -> Path:
    """Write a picture as PNG: (H, W, C) or (H, W); a video (F, H, W, C) becomes its frames side by side."""
    from PIL import Image

    pixels = to_uint8(array)
    if pixels.ndim == 4:
        pixels = np.concatenate(list(pixels), axis=1)
    if pixels.ndim == 3 and pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path
