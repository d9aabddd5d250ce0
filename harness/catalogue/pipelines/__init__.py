"""Tiny end-to-end diffusers pipelines, so a parallel layout can be judged on the picture it produces.

One recipe per model with a diffusers pipeline (flux, flux2, qwenimage, wan): a seeded, "sharpened" transformer
(see `common.sharpen`), a tiny seeded VAE, a flow-matching Euler scheduler and no text encoder: prompt embeddings
come from a seeded CPU generator, as do the initial latents, so every rank and every device draws the same numbers.

    pipe = build_pipeline("flux", torch.bfloat16)
    transformer_of(pipe).set_attention_backend("native")       # the caller's choice
    transformer_of(pipe).enable_parallelism(config=...)        # the caller's choice
    image = run_pipeline(pipe, "flux")                          # float32 numpy in [0, 1]: (H, W, 3), or (F, H, W, 3)

Why sharpened: with plain random weights (64x64, 4 steps) the classic broken layout (each rank attends only to
its own chunk) measured SSIM 0.9997-0.99998 / PSNR 51-61 dB against the correct picture, i.e. invisible.
Sharpened, it measures SSIM 0.71-0.86 / PSNR 21-25 dB / max pixel error 0.3-0.5 at 2 ranks, while correct layouts
stay at PSNR >= 134 dB in fp32 and bf16 stays >= 46 dB from its fp32 or single-process picture
(benchmarks/image_separation.py).
A single-process run costs 0.01-0.06 s on one CPU thread (Wan's 5 frames the most), 0.03-0.4 s per rank under
torchrun with gloo at 2 ranks; building one costs ~0.03 s after the first diffusers import (3-5 s).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import torch

from harness.catalogue.pipelines import common, flux, flux2, qwenimage, wan
from harness.core.errors import HarnessError

RECIPES: dict[str, common.Recipe] = {r.name: r for r in (flux.RECIPE, flux2.RECIPE, qwenimage.RECIPE, wan.RECIPE)}
MODELS = tuple(RECIPES)


def recipe(name: str) -> common.Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise HarnessError(f"no tiny pipeline for model {name!r}; models with one: {', '.join(MODELS)}") from None


def pipeline_class(name: str) -> type | None:
    """The diffusers pipeline class the zoo's model `name` runs in (None: no tiny pipeline for it), without building
    one: where a flow's call is a pipeline's own loader (harness.flows.scope)."""
    if name not in RECIPES:
        return None
    _require_transformers()
    import diffusers

    return getattr(diffusers, RECIPES[name].pipeline)


def build_pipeline(name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                   weights: dict[str, torch.Tensor] | None = None):
    """The model's pipeline, built in fp32 (seeded weights, or `weights` from a reference as returned by
    `pipeline_weights`) and cast once to `dtype`, progress bar off."""
    spec = recipe(name)
    _require_transformers()
    pipe = spec.build()
    if weights is not None:
        for component, module in _modules(pipe):
            prefix = f"{component}."
            module.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
    return _finish(pipe, dtype, device)


def load_pipeline(name: str, folder, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
    """A real checkpoint from a local diffusers pipeline folder (`from_pretrained` on a path, never the hub),
    without its text encoders and tokenizers: prompt embeddings are seeded stand-ins of the checkpoint's width."""
    from pathlib import Path

    from diffusers import DiffusionPipeline

    recipe(name)
    _require_transformers()
    folder = Path(folder)
    if not (folder / "model_index.json").exists():
        raise HarnessError(f"--weights {folder}: not a diffusers pipeline folder (no model_index.json); "
                           "pass the folder that `save_pretrained` wrote")
    index = json.loads((folder / "model_index.json").read_text())
    skipped = {key: None for key in index if key.startswith(("text_encoder", "tokenizer", "image_encoder"))}
    pipe = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True, **skipped)
    return _finish(pipe, dtype, device)


def _finish(pipe, dtype: torch.dtype, device):
    pipe.set_progress_bar_config(disable=True)
    for _, module in _modules(pipe):
        common.cast(module, dtype)
    return pipe.to(device)


def _modules(pipe):
    return [(name, module) for name, module in pipe.components.items() if isinstance(module, torch.nn.Module)]


def pipeline_weights(pipe) -> dict[str, torch.Tensor]:
    """Every module's weights, prefixed with its component name: what an image reference stores."""
    return {f"{name}.{key}": value for name, module in _modules(pipe) for key, value in module.state_dict().items()}


def _require_transformers() -> None:
    """diffusers' pipeline classes import `transformers` (for text encoders these pipelines never build); without it
    they are placeholders that fail on construction with a message about a library the user never asked for."""
    if importlib.util.find_spec("transformers") is None:
        raise HarnessError("the tiny pipelines need the `transformers` package installed (diffusers' pipeline "
                           "classes import it; no transformers model is built or downloaded)")
    from transformers.utils import logging

    logging.set_verbosity_error()  # its import logs a torchvision fallback notice that concerns no model used here


def transformer_of(pipe) -> torch.nn.Module:
    """The denoiser, on which the caller sets the attention backend and enables parallelism."""
    return pipe.transformer


@torch.no_grad()
def run_pipeline(pipe, name: str, seed: int = common.LATENT_SEED, steps: int = common.STEPS,
                 guidance: float | None = None, more: dict | None = None) -> np.ndarray:
    """Run `steps` denoising steps and decode; float32 numpy in [0, 1], (H, W, C) or (F, H, W, C) for video.
    `guidance`: a guidance scale above 1 with a negative prompt (the recipe's `negative`), so that the pipeline runs
    both branches of classifier-free guidance each step; None: the pipeline's plain call. `more`: other keyword
    arguments of the call (an IP-Adapter's image embeddings).

    The latents come from a CPU generator seeded with `seed`, which diffusers moves to the pipeline's device, so
    the noise is the same on every rank and on CPU and GPU alike.
    """
    spec = recipe(name)
    transformer = transformer_of(pipe)
    kwargs = spec.call_kwargs(transformer.config, transformer.dtype, transformer.device)
    if guidance is not None:
        if spec.negative is None:
            raise HarnessError(f"the {name} pipeline is guidance-distilled: it runs no negative branch to guide with")
        kwargs.update(spec.negative(kwargs, guidance))
    kwargs.update(more or {})
    output = pipe(
        **kwargs,
        height=common.HEIGHT,
        width=common.WIDTH,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
    )
    return np.asarray(getattr(output, spec.output)[0], dtype=np.float32)


__all__ = ["MODELS", "RECIPES", "build_pipeline", "load_pipeline", "pipeline_weights", "recipe", "run_pipeline",
           "transformer_of"]
