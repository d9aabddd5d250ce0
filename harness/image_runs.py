"""Image cases: a whole tiny diffusers pipeline per case (scheduler, generator, VAE decode), judged on the picture.

The reference is the fp32 single-device picture with the pipeline's weights; a case rebuilds the pipeline from
those weights (or from a local checkpoint folder given with `--weights`), casts it once, runs it under the layout
and compares pictures: SSIM, PSNR, max and mean pixel error.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from harness import environment
from harness.image_metrics import diff_image, image_metrics, scalar_metrics, to_png
from harness.reference import Reference, reference_path, write_reference


def has_pipeline(model: str) -> bool:
    from harness.pipelines import RECIPES

    return model in RECIPES


def weights_tag(folder) -> str:
    """The shape name under which a local checkpoint's cases and reference go: its folder name, id-safe."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(folder).resolve().name) or "weights"


def config_hash(model: str, weights_dir=None) -> str:
    from harness.pipelines import recipe

    return recipe(model).config_hash() if weights_dir is None else f"weights:{Path(weights_dir).resolve()}"


def build(model: str, dtype: str, device, reference: Reference | None = None, weights_dir=None):
    """The pipeline of a case: the reference's weights (tiny zoo) or the local checkpoint, cast once."""
    from harness import pipelines

    if weights_dir is not None:
        return pipelines.load_pipeline(model, weights_dir, dtype, device)
    return pipelines.build_pipeline(model, dtype, device, weights=reference.weights if reference else None)


def run(pipe, model: str) -> np.ndarray:
    from harness.pipelines import run_pipeline

    return run_pipeline(pipe, model)


def capture_image(model: str, root: Path, force: bool = False, weights_dir=None) -> tuple[Path, bool]:
    """The fp32 single-device picture, stored with the pipeline's weights (not a real checkpoint's: those stay in
    their folder) as safetensors, and as a PNG beside it for people."""
    from harness import determinism
    from harness.pipelines import pipeline_weights

    shape = "default" if weights_dir is None else weights_tag(weights_dir)
    path = reference_path(root, model, shape, kind="image")
    if path.exists() and not force:
        return path, False
    determinism.strict_fp32()
    pipe = build(model, "fp32", torch.device("cpu"), weights_dir=weights_dir)
    image = run(pipe, model)
    weights = pipeline_weights(pipe) if weights_dir is None else {}
    meta = {"model": model, "shape": shape, "kind": "image", "dtype": "fp32", "layout": "single",
            "backend": "native", "world_size": 1, "config": {"weights_dir": str(weights_dir) if weights_dir else None},
            "config_hash": config_hash(model, weights_dir), **environment.describe()}
    written = write_reference(path, weights, {}, torch.from_numpy(image), meta, force=force)
    if written:
        to_png(image, path.with_suffix(".png"))
    return path, written


def measure(image: np.ndarray, reference: Reference, baseline, images_dir: Path | None, slug: str) -> dict:
    """Metrics against the fp32 picture and, when given, against the same-dtype single-device picture."""
    expected = reference.output.numpy()
    metrics = image_metrics(image, expected)
    record = scalar_metrics(metrics)
    if isinstance(baseline, np.ndarray):
        record["baseline"] = scalar_metrics(image_metrics(baseline, expected))
        record["vs_baseline"] = scalar_metrics(image_metrics(image, baseline))
    elif baseline is not None:
        record["baseline_error"] = baseline
    if images_dir is not None:
        record["images"] = _write_pngs(image, expected, metrics["ssim_map"], images_dir, slug)
    return record


def _write_pngs(image, expected, ssim_map, images_dir: Path, slug: str) -> dict[str, str]:
    """Reference, candidate, 10x difference and SSIM map, named after the case, relative to the report folder."""
    pictures = {"reference": expected, "candidate": image, "diff": diff_image(image, expected, gain=10.0)}
    if ssim_map is not None:
        pictures["ssim_map"] = np.clip(ssim_map, 0.0, 1.0)
    paths = {}
    for name, picture in pictures.items():
        path = to_png(picture, images_dir / f"{slug}-{name}.png")
        paths[name] = f"{images_dir.name}/{path.name}"
    return paths


def slug(case_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", case_id)
