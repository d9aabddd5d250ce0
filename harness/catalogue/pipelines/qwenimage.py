"""Qwen-Image text-to-image: `QwenImagePipeline` around the zoo's `QwenImageTransformer2DModel` config.

`AutoencoderKLQwenImage` (a causal 3D VAE used on one frame) with three 2x stages (8x), z_dim 4 to match the
transformer's 16 = 4 x (2x2) packed input channels; 64x64 pictures are 16 image tokens.
The text mask is all ones, which the pipeline turns into "no mask" (ring attention accepts no mask).
"""

from __future__ import annotations

import torch

from harness.catalogue.pipelines import common
from harness.catalogue.zoo import get_spec

TRANSFORMER = dict(get_spec("qwenimage").config)
Z_DIM = TRANSFORMER["in_channels"] // 4
CONTRAST = 2.0  # see common.seeded_vae
EMBED_GAIN = 0.1  # see common.sharpen
VAE = common.wan_family_vae(Z_DIM)


def build():
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel

    return QwenImagePipeline(
        scheduler=common.scheduler(),
        vae=common.seeded_vae(lambda: AutoencoderKLQwenImage(**VAE), CONTRAST),
        text_encoder=None, tokenizer=None,
        transformer=common.seeded_transformer(QwenImageTransformer2DModel, TRANSFORMER, "img_in", EMBED_GAIN),
    )


def call_kwargs(config, dtype: torch.dtype, device: torch.device) -> dict:
    """`config`: the loaded transformer's config, so a real checkpoint gets embeddings of its own width."""
    (prompt,) = common.embeds((1, common.TEXT_TOKENS, config["joint_attention_dim"]), dtype=dtype, device=device)
    mask = torch.ones(1, common.TEXT_TOKENS, dtype=torch.long, device=device)
    return {"prompt_embeds": prompt, "prompt_embeds_mask": mask, "true_cfg_scale": 1.0}


def negative(kwargs: dict, scale: float) -> dict:
    """True CFG, as `QwenImagePipeline` runs it with `true_cfg_scale` above 1 and a negative prompt: the prompt's
    embeddings negated stand for the negative prompt's."""
    return {"negative_prompt_embeds": -kwargs["prompt_embeds"],
            "negative_prompt_embeds_mask": kwargs["prompt_embeds_mask"], "true_cfg_scale": scale}


RECIPE = common.Recipe("qwenimage", "QwenImagePipeline", build, call_kwargs,
                       config={"transformer": TRANSFORMER, "vae": VAE, "contrast": CONTRAST, "embed_gain": EMBED_GAIN},
                       negative=negative)
