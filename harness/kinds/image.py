"""The `image` kind: a whole tiny diffusers pipeline (scheduler, one generator on every rank, VAE decode), judged on
the picture: SSIM, PSNR and max pixel error against the fp32 picture and, for low precision, against the
single-device picture of the same dtype. With `--weights DIR` the pipeline is a local checkpoint instead.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import torch

from harness.core import determinism
from harness.core.evidence import Evidence
from harness.core.records import Case
from harness.core.reference import Reference, reference_meta, reference_path, write_reference
from harness.core.results import CaseResult
from harness.kinds.base import Built, Check, Kind, Policy
from harness.rank.image_metrics import diff_image, image_metrics, scalar_metrics, to_png, violations


def has_pipeline(model: str) -> bool:
    from harness.catalogue.pipelines import RECIPES

    return model in RECIPES


def weights_tag(folder) -> str:
    """The shape name under which a local checkpoint's cases and reference go: its folder name, id-safe."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(folder).resolve().name) or "weights"


def slug(case_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", case_id)


def build_pipe(model: str, dtype: str, device, reference: Reference | None = None, weights_dir=None):
    """The pipeline of a case: the reference's weights (tiny zoo) or the local checkpoint, cast once."""
    from harness.catalogue import pipelines

    if weights_dir is not None:
        return pipelines.load_pipeline(model, weights_dir, dtype, device)
    return pipelines.build_pipeline(model, dtype, device, weights=reference.weights if reference else None)


def run_pipe(pipe, model: str) -> np.ndarray:
    from harness.catalogue.pipelines import run_pipeline

    return run_pipeline(pipe, model)


class ImageKind(Kind):
    name = "image"
    help = "a whole tiny pipeline, judged on the picture"
    checks = {"nonfinite": Check(), "ssim": Check("comparisons"), "psnr": Check("comparisons"),
              "max_pixel_err": Check("comparisons")}
    cost_s = 0.45  # the quick plan's recorded case seconds: 0.36 s on one rank, 0.77 s on four

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("transformers") is None:
            return "image cases need the `transformers` package (diffusers' pipeline classes import it)"
        return None

    def shapes(self, spec, wanted, weights_dir):
        if not has_pipeline(spec.name):
            return []
        if weights_dir is None:
            return [("default", None)]
        return [(weights_tag(weights_dir), str(Path(weights_dir).resolve()))]

    def reference_hash(self, case: Case) -> str:
        return _config_hash(case.model, case.weights_dir)

    def capture(self, model, shape, root, force=False, weights_dir=None) -> tuple[Path, bool]:
        """The fp32 single-device picture, stored with the pipeline's weights (not a real checkpoint's: those stay
        in their folder) as safetensors, and as a PNG beside it for people."""
        from harness.catalogue.pipelines import pipeline_weights

        path = reference_path(root, model, shape, kind=self.name)
        if path.exists() and not force:
            return path, False
        determinism.strict_fp32()
        pipe = build_pipe(model, "fp32", torch.device("cpu"), weights_dir=weights_dir)
        image = run_pipe(pipe, model)
        weights = pipeline_weights(pipe) if weights_dir is None else {}
        meta = reference_meta(model, shape, self.name, {"weights_dir": str(weights_dir) if weights_dir else None},
                              _config_hash(model, weights_dir))
        written = write_reference(path, weights, {}, torch.from_numpy(image), meta, force=force)
        if written:
            to_png(image, path.with_suffix(".png"))
        return path, written

    def build(self, case: Case, reference: Reference, device) -> Built:
        pipe = build_pipe(case.model, case.dtype, device, reference, case.weights_dir)
        pipe.transformer.set_attention_backend(case.backend)
        # The VAE may call SDPA itself: only the transformer's attention kernels prove the backend.
        return Built(pipe.transformer, lambda: run_pipe(pipe, case.model), kernel_scope=pipe.transformer)

    def detach(self, output):
        return output

    def measure(self, output, reference, baseline, case, images_dir, draws=None) -> dict:
        """Against the fp32 picture and, for low precision, against the same-dtype single-device picture."""
        expected = reference.output.numpy()
        full = image_metrics(output, expected)
        metrics = scalar_metrics(full)
        if case.dtype != "fp32" and isinstance(baseline, np.ndarray):
            metrics["baseline"] = scalar_metrics(image_metrics(baseline, expected))
            metrics["vs_baseline"] = scalar_metrics(image_metrics(output, baseline))
        elif case.dtype != "fp32" and baseline is not None:
            metrics["baseline_error"] = baseline
        if images_dir is not None:
            metrics["images"] = _write_pngs(output, expected, full["ssim_map"], images_dir, slug(case.case_id))
        return metrics

    def judge(self, result: CaseResult, metrics: dict, policy: Policy) -> list[Evidence]:
        limits = policy.image_limits
        for key in ("ssim", "psnr", "max_abs_err", "mean_abs_err", "nonfinite"):
            setattr(result, key, metrics.get(key))
        result.tolerance = limits["max_abs_err_max"]
        result.extra.update({key: metrics[key] for key in ("images", "baseline", "vs_baseline") if key in metrics})
        found = []
        if result.nonfinite:
            found.append(Evidence("nonfinite", f"image has {result.nonfinite} non-finite values (NaN/Inf)",
                                  value=result.nonfinite, limit=0))
        against = [("vs fp32 reference", metrics)]
        if "baseline_error" in metrics:  # low precision is judged against its own single-device picture too
            found.append(Evidence("cannot_judge", f"cannot judge: the single-device {result.dtype} picture failed "
                                                  f"({metrics['baseline_error']})"))
        elif "vs_baseline" in metrics:
            result.baseline_err = metrics["baseline"]["mean_abs_err"]
            against.append((f"vs single-device {result.dtype}", metrics["vs_baseline"]))
        for subject, measured in against:
            found += [Evidence(check, f"{subject}: {text}", subject, value, limit)
                      for check, value, limit, text in violations(measured, limits)]
        return found

    def cell(self, result: CaseResult) -> str:
        return f" ssim {result.ssim:.4f}" if result.ssim is not None else super().cell(result)


def _config_hash(model: str, weights_dir=None) -> str:
    from harness.catalogue.pipelines import recipe

    return recipe(model).config_hash() if weights_dir is None else f"weights:{Path(weights_dir).resolve()}"


def _write_pngs(image, expected, ssim_map, images_dir: Path, name: str) -> dict[str, str]:
    """Reference, candidate, 10x difference and SSIM map, named after the case, relative to the report folder."""
    pictures = {"reference": expected, "candidate": image, "diff": diff_image(image, expected, gain=10.0)}
    if ssim_map is not None:
        pictures["ssim_map"] = np.clip(ssim_map, 0.0, 1.0)
    paths = {}
    for picture_name, picture in pictures.items():
        path = to_png(picture, images_dir / f"{name}-{picture_name}.png")
        paths[picture_name] = f"{images_dir.name}/{path.name}"
    return paths
