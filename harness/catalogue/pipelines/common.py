"""What every tiny pipeline shares: the recipe type, the seeded "sharpening" of random weights, seeded prompt embeds.

A randomly initialised diffusion transformer is nearly blind to a broken context-parallel layout: its attention is
close to a uniform average, so losing half of the keys barely moves the average, and the latents are dominated by
the initial noise rather than by the transformer. `sharpen` rescales three groups of weights, deterministically and
in fp32 at build time, so that the picture depends on which tokens each token attends to (see the docstring of
`harness.catalogue.pipelines` for the measured effect).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# Multiplies the QK-norm weights: attention logits grow by its square, so attention picks a few keys instead of
# averaging them all, and a rank that sees only its own chunk picks different keys.
QK_GAIN = 2.0
# Multiplies the output projection: the velocity dominates the initial noise in every Euler step, so the final
# latents (and the decoded picture) are the transformer's work rather than the seed's noise.
OUT_GAIN = 10.0
# (Each recipe also multiplies its latent patch embedding by its EMBED_GAIN, 0.03 or 0.1: the per-token residual
# stream shrinks, so what attention mixed in from other tokens dominates each token's state.)

QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")

HEIGHT = WIDTH = 64
# Two Euler steps, not more: bf16 rounding compounds chaotically from step to step in a sharpened model (4 steps cost
# the bf16 image ~8 dB of PSNR against the fp32 one), while a broken layout is already wrong at every step.
STEPS = 2
TEXT_TOKENS = 8
EMBED_SEED = 1
LATENT_SEED = 2


@dataclass(frozen=True)
class Recipe:
    """How to build one model's tiny pipeline (fp32, seeded) and what to pass when calling it.

    `call_kwargs(transformer_config, dtype, device)` returns everything but the generator and output type; `output`
    names the field
    of the pipeline's output that holds the pictures ("images" or "frames"); `config` is what `config_hash` covers;
    `negative(call_kwargs, scale)` what classifier-free guidance by `scale` adds to the call, as a user's negative
    prompt and a guidance scale above 1 do (None: a guidance-distilled pipeline, one branch a step).
    """

    name: str
    pipeline: str  # the diffusers pipeline class it builds: what a user calls the pipeline's own loaders on
    build: Callable[[], Any]
    call_kwargs: Callable[[Any, torch.dtype, torch.device], dict]
    output: str = "images"
    config: dict = field(default_factory=dict)
    negative: Callable[[dict, float], dict] | None = None

    def config_hash(self) -> str:
        """Identifies everything that shapes the picture, so a stored reference image is known stale when it changes."""
        shared = {"qk_gain": QK_GAIN, "out_gain": OUT_GAIN, "size": (HEIGHT, WIDTH), "steps": STEPS,
                  "text_tokens": TEXT_TOKENS, "seeds": (EMBED_SEED, LATENT_SEED)}
        payload = json.dumps({"name": self.name, **self.config, **shared}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@torch.no_grad()
def sharpen(transformer: torch.nn.Module, embedder: str, embed_gain: float) -> torch.nn.Module:
    """Rescale QK norms, the latent embedding (`embedder`, by `embed_gain`) and the output projection, in place."""
    for name, module in transformer.named_modules():
        if name.rsplit(".", 1)[-1] in QK_NORMS and getattr(module, "weight", None) is not None:
            module.weight.mul_(QK_GAIN)
    _scale(transformer.get_submodule(embedder), embed_gain)
    _scale(transformer.proj_out, OUT_GAIN)
    return transformer


def _scale(module: torch.nn.Module, gain: float) -> None:
    module.weight.mul_(gain)
    if getattr(module, "bias", None) is not None:
        module.bias.mul_(gain)


def seeded_transformer(cls, config: dict, embedder: str, embed_gain: float) -> torch.nn.Module:
    """The transformer with `torch.manual_seed(0)` weights, sharpened; fp32, eval mode."""
    torch.manual_seed(0)
    return sharpen(cls(**config).eval(), embedder, embed_gain)


def seeded_vae(factory: Callable[[], torch.nn.Module], contrast: float) -> torch.nn.Module:
    """The VAE with `torch.manual_seed(0)` weights; its last decoder conv is scaled by `contrast`.

    Random decoders differ in output range: too flat and SSIM's stabilising constants swamp the structure, too
    strong and clamping to [0, 1] hides differences. `contrast` (per recipe, measured once) brings the decoded
    pictures to a pixel standard deviation of about 0.15 with almost nothing clamped.
    """
    torch.manual_seed(0)
    vae = factory().eval()
    with torch.no_grad():
        _scale(vae.decoder.conv_out, contrast)
    return vae


def cast(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast floating weights to `dtype` the way `from_pretrained(torch_dtype=...)` does: the modules a class lists in
    `_keep_in_fp32_modules` (Wan's norms, time embedder, rope) stay fp32. `ModelMixin.to(dtype)` would cast them too,
    and warns about it."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point():
            parts = name.split(".")
            tensor.data = tensor.data.to(torch.float32 if any(k in parts for k in keep) else dtype)
    return module


def embeds(*shapes: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Stand-ins for text-encoder outputs: drawn on the CPU from one seeded generator, so every rank and every
    device gets the same values, then cast once to the pipeline's dtype."""
    generator = torch.Generator().manual_seed(EMBED_SEED)
    return [torch.randn(*shape, generator=generator).to(device=device, dtype=dtype) for shape in shapes]


def wan_family_vae(z_dim: int) -> dict:
    """The tiny config of the Wan-family VAEs (AutoencoderKLWan, AutoencoderKLQwenImage): 8x spatial and 4x
    temporal compression, zero-mean unit-std latents."""
    return {"base_dim": 8, "z_dim": z_dim, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
            "temperal_downsample": [False, True, True], "latents_mean": [0.0] * z_dim, "latents_std": [1.0] * z_dim}


def scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler()
