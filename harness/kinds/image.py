"""The `image` kind: a whole tiny diffusers pipeline (scheduler, one generator on every rank, VAE decode), judged on
the picture: SSIM, PSNR and max pixel error against the fp32 picture within the dtype's limits and, for low
precision, against the single-device picture of the same dtype within `noise_factor` times what the noisiest of its
forward noise draws (harness.rank.noise) does to that picture. With `--weights DIR` the pipeline is a local
checkpoint instead.
"""

from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import dataclass
from pathlib import Path

from harness.core.evidence import Evidence
from harness.core.figures import PARITY, SINGLE_DEVICE, FigureSpec, images
from harness.core.options import Option
from harness.kinds.base import FLOW_FAMILIES, Built, Check, Kind, every_model_slice, slice_ids

# SSIM and PSNR must reach their limits: SSIM's margin is measured in deficits from 1, PSNR's in the errors its
# decibels stand for (harness.core.figures.margin)
SSIM = FigureSpec("ssim", "SSIM", ".6f", cell="ssim {value:.4f}", short="ssim", at_least=True, ideal=1.0)
PSNR = FigureSpec("psnr", "PSNR (dB)", ".2f", short="psnr", at_least=True, ideal=None)
MAX_PIXEL = FigureSpec("max_abs_err", "max pixel error", short="pixel")
MEAN_PIXEL = FigureSpec("mean_abs_err", "mean pixel error")
NONFINITE = FigureSpec("nonfinite", "non-finite values", "d")
BASELINE = FigureSpec("baseline_err", "baseline mean pixel error (one device, same dtype)")
VS_SSIM = FigureSpec("vs_baseline_ssim", "SSIM vs one device, same dtype", ".6f", short="ssim 1-dev", at_least=True,
                     ideal=1.0)
VS_PSNR = FigureSpec("vs_baseline_psnr", "PSNR vs one device, same dtype (dB)", ".2f", short="psnr 1-dev",
                     at_least=True, ideal=None)
VS_MAX = FigureSpec("vs_baseline_max_abs", "max pixel diff to one device, same dtype", role=PARITY,
                    short="pixel 1-dev")
NOISE = FigureSpec("noise_max_abs", "max pixel diff of the noisiest single-device draw, same dtype")
DIFF_GAIN = 10.0  # the difference picture shows |candidate - compared| this many times brighter
SINGLE_RUN = FigureSpec("single_max_abs_err", "max pixel error of the single-device picture (same dtype)",
                        role=SINGLE_DEVICE, short="1-dev pixel")


@dataclass(frozen=True)
class ImagePolicy:
    limits: dict[str, float]  # ssim_min, psnr_min, max_abs_err_max, against the fp32 picture
    noise_factor: float  # low precision: against the same-dtype picture, in multiples of its noise draws'


def has_pipeline(model: str) -> bool:
    from harness.catalogue.pipelines import RECIPES

    return model in RECIPES


def weights_tag(folder) -> str:
    """The shape name under which a local checkpoint's cases and reference go: its folder name, id-safe."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(folder).resolve().name) or "weights"


def slug(case_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", case_id)


def build_pipe(model: str, dtype: str, device, reference=None, weights_dir=None):
    """The pipeline of a case: the reference's weights (tiny zoo) or the local checkpoint, cast once to the case's
    `dtype` (its name, e.g. "bf16")."""
    from harness.catalogue import pipelines
    from harness.core.dtypes import torch_dtype

    cast_to = torch_dtype(dtype)
    if weights_dir is not None:
        return pipelines.load_pipeline(model, weights_dir, cast_to, device)
    return pipelines.build_pipeline(model, cast_to, device, weights=reference.weights if reference else None)


def run_pipe(pipe, model: str, loop=None, flow_inputs=None):
    """The pipeline's call; through `loop` (harness.flows.pipeline_loop) for a flow that decides per step; with what
    the case's flow passes with each call besides (`flow_inputs()`: an IP-Adapter's image)."""
    from harness.catalogue.pipelines import run_pipeline

    more = None if flow_inputs is None else flow_inputs()
    if loop is None:
        return run_pipeline(pipe, model, more=more)
    return loop.run(lambda steps, guidance: run_pipeline(pipe, model, steps=steps, guidance=guidance, more=more))


class ImageKind(Kind):
    name = "image"
    help = "a whole tiny pipeline, judged on the picture"
    checks = {"nonfinite": Check(), "ssim": Check("comparisons"), "psnr": Check("comparisons"),
              "max_pixel_err": Check("comparisons")}
    figures = (SSIM, PSNR, MAX_PIXEL, MEAN_PIXEL, NONFINITE, BASELINE, VS_SSIM, VS_PSNR, VS_MAX, NOISE, SINGLE_RUN)
    # For the tiny pipelines (64x64, 2 steps), from benchmarks/image_separation.py: correct layouts measure fp32 SSIM
    # 1 - 1e-12, PSNR >= 110 dB, max <= 1e-5; bf16 (vs the fp32 and the bf16 single-device picture) SSIM >= 0.9991,
    # PSNR >= 46.5 dB, max <= 0.039; broken layouts SSIM <= 0.86, PSNR <= 25.3 dB, max >= 0.27 in every dtype (SSIM
    # <= 0.921, PSNR <= 29.9 dB over 8 latent seeds). Each limit sits between the two, in ratio terms.
    limits = Option("limits", {"fp32": {"ssim_min": 0.9999, "psnr_min": 60.0, "max_abs_err_max": 5e-3},
                               "bf16": {"ssim_min": 0.99, "psnr_min": 38.0, "max_abs_err_max": 0.10},
                               "fp16": {"ssim_min": 0.999, "psnr_min": 45.0, "max_abs_err_max": 0.03}},
                    "SSIM, PSNR and max pixel error limits per dtype.", is_table=True)
    options = (Option("noise_factor", 2.0, "Low precision: how far the picture may be from the single-device "
                                           "picture of its dtype, in multiples of the noisiest of four draws there."),)
    cost_s = 0.45  # the quick plan's recorded case seconds: 0.36 s on one rank, 0.77 s on four

    def policy(self, settings, dtype: str) -> ImagePolicy:
        return ImagePolicy(settings.limits(self.name, dtype), settings.of(self.name, "noise_factor"))

    def compile_slice(self, plan: str) -> list[str]:
        """The full plan's: every model under ulysses2, and flux on one device (the quick plan compiles no picture)."""
        if plan != "full":
            return []
        from harness.catalogue.zoo import SPECS

        return [*slice_ids(self.name, SPECS, (("ulysses2", "native"),)),
                *slice_ids(self.name, ("flux",), (("single", "native"),))]

    def flow_slice(self, plan: str) -> list[str]:
        """quick: flux's picture under ulysses2 and tp2 with its flows (a LoRA on the transformer, the pipeline's
        CPU offload: harness.flows). full: every model with a pipeline on each flow family."""
        if plan == "quick":
            return slice_ids(self.name, ("flux",), (("ulysses2", "native"), ("tp2", "native")))
        return every_model_slice(self.name, FLOW_FAMILIES) if plan == "full" else []

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

    def reference_hash(self, case) -> str:
        return _config_hash(case.model, case.weights_dir)

    def capture(self, model, shape, root, force=False, weights_dir=None) -> tuple[Path, bool]:
        """The fp32 single-device picture, stored with the pipeline's weights (not a real checkpoint's: those stay
        in their folder) as safetensors, and as a PNG beside it for people."""
        import torch

        from harness.catalogue.pipelines import pipeline_weights
        from harness.core import determinism
        from harness.core.reference import reference_meta, reference_path, write_reference
        from harness.kinds.capturing import module_record
        from harness.rank.fingerprint import Recorder
        from harness.rank.image_metrics import to_png

        path = reference_path(root, model, shape, kind=self.name)
        if path.exists() and not force:
            return path, False
        determinism.strict_fp32()
        pipe = build_pipe(model, "fp32", torch.device("cpu"), weights_dir=weights_dir)
        with Recorder(pipe.transformer) as recorder:  # the transformer's modules at every step
            image = run_pipe(pipe, model)
        weights = pipeline_weights(pipe) if weights_dir is None else {}
        meta = reference_meta(model, shape, self.name, {"weights_dir": str(weights_dir) if weights_dir else None},
                              _config_hash(model, weights_dir))
        modules = module_record(recorder.finish(image))
        written = write_reference(path, weights, {}, torch.from_numpy(image), meta, force=force, modules=modules)
        if written:
            to_png(image, path.with_suffix(".png"))
        return path, written

    def build(self, case, reference, device, load) -> Built:
        from harness import flows
        from harness.catalogue.zoo import get_spec
        from harness.core.dtypes import torch_dtype
        from harness.flows import pipeline_loop
        from harness.rank import loading, noise

        dtype = torch_dtype(case.dtype)
        pipe = loading.pipeline(  # the case's load's way: the pipeline folder with the parallel transformer passed in
            load, lambda: build_pipe(case.model, case.dtype, device, reference, case.weights_dir),
            lambda: loading.transformer(load, _auto_model(), reference, device, dtype, "transformer"),
            device, dtype)
        pipe.transformer.set_attention_backend(case.backend)
        weights = {key.removeprefix("transformer."): value for key, value in reference.weights.items()
                   if key.startswith("transformer.")} if case.weights_dir is None else None
        draw, loop = noise.ForwardDraw(pipe.transformer, weights), \
            pipeline_loop.of_flow(case.flow, get_spec(case.model), pipe)
        passed = flows.inputs_of(case.flow, self.name)
        flow_inputs = None if passed is None else (lambda: passed(pipe.transformer, device, dtype))
        # The VAE may call SDPA itself: only the transformer's attention kernels prove the backend.
        return Built(pipe.transformer, lambda: draw.run(lambda: run_pipe(pipe, case.model, loop, flow_inputs)),
                     kernel_scope=pipe.transformer, twin=draw.twin, pipeline=pipe, denoising=loop)

    def save_checkpoint(self, case, reference, target) -> None:
        """The whole tiny pipeline folder, the reference's weights in each component."""
        import torch

        from harness.rank import loading

        loading.save_pipeline(build_pipe(case.model, "fp32", torch.device("cpu"), reference), target)

    def repro_refusal(self, case) -> str:
        return "image cases are not scripted (a whole pipeline); tensor and train cases are"

    def detach(self, output):
        return output

    def measure(self, output, reference, baseline, case, images_dir, draws=None) -> dict:
        """Against the fp32 picture and, for low precision, against the same-dtype single-device picture."""
        import numpy as np

        from harness.rank.image_metrics import image_metrics, scalar_metrics

        expected = reference.output.numpy()
        full = image_metrics(output, expected)
        metrics = scalar_metrics(full)
        if isinstance(baseline, np.ndarray):
            metrics["single"] = scalar_metrics(image_metrics(baseline, expected))
        if case.dtype != "fp32" and isinstance(baseline, np.ndarray):
            metrics["baseline"] = metrics["single"]
            metrics["vs_baseline"] = scalar_metrics(image_metrics(output, baseline))
            draws = draws or {}
            metrics["noise"] = {name: scalar_metrics(image_metrics(run, baseline)) for name, run in draws.items()
                                if isinstance(run, np.ndarray)}
            metrics["noise_errors"] = {name: run for name, run in draws.items() if isinstance(run, str)}
        elif case.dtype != "fp32" and baseline is not None:
            metrics["baseline_error"] = baseline
        if images_dir is not None:  # low precision's parity check compares with its own single-device picture
            own = baseline if case.dtype != "fp32" and isinstance(baseline, np.ndarray) else None
            metrics["images"] = _write_pngs(output, expected, own, full["ssim_map"], images_dir, slug(case.case_id))
        return metrics

    def draws_for(self, case) -> tuple[str, ...]:
        """Low precision is judged against its own single-device picture, by the noise of its dtype there."""
        from harness.rank import noise

        return noise.FORWARD_DRAWS if case.dtype != "fp32" else ()

    def judge(self, result, metrics: dict, policy: ImagePolicy) -> list[Evidence]:
        from harness.rank.image_metrics import violations

        limits = policy.limits
        nonfinite = metrics.get("nonfinite")
        fixed = f"fixed, the {result.dtype} entry of image_limits"
        figures = [SSIM.of(metrics.get("ssim"), limits["ssim_min"], fixed),
                   PSNR.of(metrics.get("psnr"), limits["psnr_min"], fixed),
                   MAX_PIXEL.of(metrics.get("max_abs_err"), limits["max_abs_err_max"], fixed),
                   MEAN_PIXEL.of(metrics.get("mean_abs_err")), NONFINITE.of(nonfinite)]
        if "images" in metrics:
            result.extra["blocks"] = [_images_block(metrics["images"], result.dtype), *result.extra.get("blocks", [])]
        found = []
        if nonfinite:
            found.append(Evidence("nonfinite", f"image has {nonfinite} non-finite values (NaN/Inf)",
                                  value=nonfinite, limit=0))
        against = [("vs fp32 reference", metrics, limits)]
        if "baseline_error" in metrics:  # low precision is judged against its own single-device picture too
            found.append(Evidence("cannot_judge", f"cannot judge: the single-device {result.dtype} picture failed "
                                                  f"({metrics['baseline_error']})"))
        elif "vs_baseline" in metrics and (metrics["noise_errors"] or not metrics["noise"]):
            failed = "; ".join(f"{name}: {error}" for name, error in metrics["noise_errors"].items())
            found.append(Evidence("cannot_judge", f"cannot judge against the single-device {result.dtype} picture: "
                                                  f"its noise draws failed ({failed or 'none ran'})"))
        elif "vs_baseline" in metrics:
            own = noise_limits(metrics["noise"].values(), policy.noise_factor)
            draws = f"the noisiest of its {len(metrics['noise'])} single-device {result.dtype} draws"
            figures += [BASELINE.of(metrics["baseline"]["mean_abs_err"]),
                        VS_SSIM.of(metrics["vs_baseline"]["ssim"], own["ssim_min"],
                                   f"1 - {policy.noise_factor} x the SSIM deficit of {draws}"),
                        VS_PSNR.of(metrics["vs_baseline"]["psnr"], own["psnr_min"],
                                   f"the PSNR of {draws} less 20 log10 {policy.noise_factor} dB"),
                        VS_MAX.of(metrics["vs_baseline"]["max_abs_err"], own["max_abs_err_max"],
                                  f"{policy.noise_factor} x the max pixel difference of {draws}"),
                        NOISE.of(max(run["max_abs_err"] for run in metrics["noise"].values()))]
            against.append((f"vs single-device {result.dtype}", metrics["vs_baseline"], own))
        for subject, measured, held_to in against:
            found += [Evidence(check, f"{subject}: {text}", subject, value, limit)
                      for check, value, limit, text in violations(measured, held_to)]
        if "single" in metrics:  # what a changed model, backend or compiler shows: one device off the reference too
            figures.append(SINGLE_RUN.of(metrics["single"]["max_abs_err"], limits["max_abs_err_max"], fixed))
        result.figures = figures
        return found

    def rank_tolerance(self, policy: ImagePolicy) -> float:
        return policy.limits["max_abs_err_max"]


def noise_limits(draws, factor: float) -> dict[str, float]:
    """Limits against the same-dtype single-device picture from what its noise draws do to it: `factor` times the
    largest pixel difference and the largest SSIM deficit, and a PSNR `factor` times the error (20 log10 factor dB)
    below the lowest; no fixed floor."""
    draws = list(draws)
    return {"max_abs_err_max": factor * max(run["max_abs_err"] for run in draws),
            "ssim_min": 1.0 - factor * max(1.0 - run["ssim"] for run in draws),
            "psnr_min": min(run["psnr"] for run in draws) - 20.0 * math.log10(factor)}
def _images_block(paths: dict[str, str], dtype: str) -> dict:
    """The pictures with what each is: the difference is to the picture the parity check compares with."""
    compared = "the fp32 reference" if "baseline" not in paths else f"one device, {dtype}"
    top = 1.0 / DIFF_GAIN
    captions = {"reference": "reference (fp32, one device)", "baseline": f"one device, {dtype} (compared with)",
                "candidate": f"this layout, {dtype}", "diff": f"difference to {compared}, \u00d7{DIFF_GAIN:g}",
                "ssim_map": "SSIM map against the fp32 reference"}
    scales = {"diff": {"ticks": ["0", f"{top / 2:g}", f"\u2265 {top:g}"],
                       "note": f"black = equal, white = off by {top:g} or more (pixels in [0, 1], amplified "
                               f"\u00d7{DIFF_GAIN:g})"},
              "ssim_map": {"ticks": ["\u2264 0", "0.5", "1"],
                           "note": "white = same structure, black = none; clipped to [0, 1]"}}
    return images("Images", paths, {role: captions[role] for role in paths},
                  {role: scale for role, scale in scales.items() if role in paths})


def _auto_model():
    """diffusers' AutoModel, which the guide loads a pipeline's transformer with (its class from the folder)."""
    from diffusers import AutoModel

    return AutoModel


def _config_hash(model: str, weights_dir=None) -> str:
    from harness.catalogue.pipelines import recipe

    return recipe(model).config_hash() if weights_dir is None else f"weights:{Path(weights_dir).resolve()}"


def _write_pngs(image, expected, own, ssim_map, images_dir: Path, name: str) -> dict[str, str]:
    """The fp32 reference, low precision's own single-device picture (`own`, None in fp32), the candidate, the
    difference to the picture the parity check compares with (amplified DIFF_GAIN times) and the SSIM map against
    the fp32 reference, named after the case, relative to the report folder."""
    import numpy as np

    from harness.rank.image_metrics import diff_image, to_png

    compared = expected if own is None else own
    pictures = {"reference": expected, **({} if own is None else {"baseline": own}), "candidate": image,
                "diff": diff_image(image, compared, gain=DIFF_GAIN)}
    if ssim_map is not None:
        pictures["ssim_map"] = np.clip(ssim_map, 0.0, 1.0)
    paths = {}
    for picture_name, picture in pictures.items():
        path = to_png(picture, images_dir / f"{name}-{picture_name}.png")
        paths[picture_name] = f"{images_dir.name}/{path.name}"
    return paths
