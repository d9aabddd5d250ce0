"""FLUX.1 text-to-image: `FluxPipeline` around the zoo's `FluxTransformer2DModel` config, 4 latent channels.

The VAE is diffusers' test `AutoencoderKL` grown to four 8x-upsampling blocks: a 64x64 picture is a 8x8 latent,
packed into 4x4 = 16 image tokens, so each token paints a smooth 16x16 patch that SSIM can see.
"""

from __future__ import annotations

import torch

from harness.catalogue.pipelines import common
from harness.catalogue.zoo import get_spec

LATENT_CHANNELS = 4
TRANSFORMER = {**get_spec("flux").config, "in_channels": 4 * LATENT_CHANNELS}
CONTRAST = 0.6  # see common.seeded_vae
EMBED_GAIN = 0.03  # see common.sharpen
VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (16,) * 4,
    "layers_per_block": 1,
    "latent_channels": LATENT_CHANNELS,
    "norm_num_groups": 4,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "mid_block_add_attention": False,
    "shift_factor": 0.0,
    "scaling_factor": 1.0,
}


def build():
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel

    return FluxPipeline(
        scheduler=common.scheduler(),
        vae=common.seeded_vae(lambda: AutoencoderKL(**VAE), CONTRAST),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
        transformer=common.seeded_transformer(FluxTransformer2DModel, TRANSFORMER, "x_embedder", EMBED_GAIN),
    )


def call_kwargs(config, dtype: torch.dtype, device: torch.device) -> dict:
    """`config`: the loaded transformer's config, so a real checkpoint gets embeddings of its own width."""
    prompt, pooled = common.embeds((1, common.TEXT_TOKENS, config["joint_attention_dim"]),
                                   (1, config["pooled_projection_dim"]), dtype=dtype, device=device)
    return {"prompt_embeds": prompt, "pooled_prompt_embeds": pooled}


def negative(kwargs: dict, scale: float) -> dict:
    """True CFG, as `FluxPipeline` runs it with `true_cfg_scale` above 1 and a negative prompt: the prompt's embeddings
    negated stand for the negative prompt's."""
    return {"negative_prompt_embeds": -kwargs["prompt_embeds"],
            "negative_pooled_prompt_embeds": -kwargs["pooled_prompt_embeds"], "true_cfg_scale": scale}


RECIPE = common.Recipe("flux", "FluxPipeline", build, call_kwargs,
                       config={"transformer": TRANSFORMER, "vae": VAE, "contrast": CONTRAST, "embed_gain": EMBED_GAIN},
                       negative=negative)
