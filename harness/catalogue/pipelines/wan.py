"""Wan 2.1 text-to-video: `WanPipeline` with a few frames, no classifier-free guidance.

The transformer config is the zoo's tiny Wan config (heads 4, head_dim 12, in/out 4, text_dim 16).
`AutoencoderKLWan` with 8x spatial and 4x temporal compression: 5 frames of 64x64 are 2 latent frames of 8x8,
2 x 4 x 4 = 32 tokens.
"""

from __future__ import annotations

import torch

from harness.catalogue.pipelines import common
from harness.catalogue.zoo import get_spec

FRAMES = 5
TRANSFORMER = {**get_spec("wan").config, "patch_size": (1, 2, 2)}
Z_DIM = TRANSFORMER["in_channels"]
CONTRAST = 1.1  # see common.seeded_vae
EMBED_GAIN = 0.03  # see common.sharpen
VAE = common.wan_family_vae(Z_DIM)


def build():
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    return WanPipeline(
        tokenizer=None, text_encoder=None,
        vae=common.seeded_vae(lambda: AutoencoderKLWan(**VAE), CONTRAST),
        scheduler=common.scheduler(),
        transformer=common.seeded_transformer(WanTransformer3DModel, TRANSFORMER, "patch_embedding", EMBED_GAIN),
    )


def call_kwargs(config, dtype: torch.dtype, device: torch.device) -> dict:
    """`config`: the loaded transformer's config, so a real checkpoint gets embeddings of its own width."""
    (prompt,) = common.embeds((1, common.TEXT_TOKENS, config["text_dim"]), dtype=dtype, device=device)
    return {"prompt_embeds": prompt, "guidance_scale": 1.0, "num_frames": FRAMES}


def negative(kwargs: dict, scale: float) -> dict:
    """Classifier-free guidance, as `WanPipeline` runs it with `guidance_scale` above 1: the prompt's embeddings
    negated stand for the negative prompt's."""
    return {"negative_prompt_embeds": -kwargs["prompt_embeds"], "guidance_scale": scale}


RECIPE = common.Recipe("wan", "WanPipeline", build, call_kwargs, output="frames",
                       config={"transformer": TRANSFORMER, "vae": VAE, "contrast": CONTRAST, "embed_gain": EMBED_GAIN},
                       negative=negative)
