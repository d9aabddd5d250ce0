"""FLUX.2 text-to-image: `Flux2Pipeline` around the zoo's `Flux2Transformer2DModel` config, 4 latent channels.

`AutoencoderKLFlux2` as in diffusers' pipeline test, grown to four blocks (8x) like the FLUX.1 recipe; its batch
norm keeps its initial statistics (mean 0, variance 1), so the pipeline's latent de-normalisation is the identity.
"""

from __future__ import annotations

import torch

from harness.catalogue.pipelines import common
from harness.catalogue.pipelines.flux import LATENT_CHANNELS
from harness.catalogue.pipelines.flux import VAE as FLUX_VAE
from harness.catalogue.zoo import get_spec

TRANSFORMER = {**get_spec("flux2").config, "in_channels": 4 * LATENT_CHANNELS}
CONTRAST = 0.65  # see common.seeded_vae
EMBED_GAIN = 0.03  # see common.sharpen
# FLUX.1's tiny VAE; AutoencoderKLFlux2 has no shift or scaling factor.
VAE = {key: value for key, value in FLUX_VAE.items() if key not in ("shift_factor", "scaling_factor")}


def build():
    from diffusers import AutoencoderKLFlux2, Flux2Pipeline, Flux2Transformer2DModel

    return Flux2Pipeline(
        scheduler=common.scheduler(),
        vae=common.seeded_vae(lambda: AutoencoderKLFlux2(**VAE), CONTRAST),
        text_encoder=None, tokenizer=None,
        transformer=common.seeded_transformer(Flux2Transformer2DModel, TRANSFORMER, "x_embedder", EMBED_GAIN),
    )


def call_kwargs(config, dtype: torch.dtype, device: torch.device) -> dict:
    """`config`: the loaded transformer's config, so a real checkpoint gets embeddings of its own width."""
    (prompt,) = common.embeds((1, common.TEXT_TOKENS, config["joint_attention_dim"]), dtype=dtype, device=device)
    return {"prompt_embeds": prompt, "guidance_scale": 4.0}


RECIPE = common.Recipe("flux2", "Flux2Pipeline", build, call_kwargs,
                       config={"transformer": TRANSFORMER, "vae": VAE, "contrast": CONTRAST, "embed_gain": EMBED_GAIN})
