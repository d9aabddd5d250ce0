"""Wan 2.1/2.2: `WanTransformer3DModel`, video latents (B, C, F, H, W) patched (1, 2, 2), T5 text without a mask.

Its `_cp_plan` splits only the video tokens (and a per-token timestep): text enters cross-attention whole, so odd
text lengths must pass every layout while odd video token counts need `ulysses_anything` / `ring_anything`.
The pipeline zero-pads T5 embeddings instead of masking them, hence no "masked" shape. "ti2v" is Wan 2.2 TI2V
(`expand_timesteps=True`): one timestep per video token, 0 on the conditioning first frame.
"""

import torch

from harness.catalogue.zoo.spec import ModelSpec, Shape, image_stream_only, randn, shapes, timestep

TIMESTEP_SCALE = 1000.0  # the pipeline passes sigma * 1000 as `timestep`

CONFIG = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 4,
    "attention_head_dim": 12,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 16,
    "freq_dim": 256,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32,
}

SHAPES = shapes(
    Shape("default", frames=2),
    Shape("txt7", frames=2, text=7),
    Shape("img15", height=3, width=5),
    Shape("ti2v", frames=2, options=("per_token_timestep",)),
)


def video_latents(generator, shape: Shape, channels: int) -> torch.Tensor:
    """(1, C, F, 2H, 2W): the latent video whose (1, 2, 2) patches give `shape`'s token grid."""
    return randn(generator, 1, channels, shape.frames, 2 * shape.height, 2 * shape.width)


def make_inputs(generator, shape: Shape):
    t = TIMESTEP_SCALE * timestep(generator)
    if shape.has("per_token_timestep"):
        # Wan 2.2 TI2V: timestep = (first-frame mask * t) per patch token, first latent frame kept clean.
        per_frame = torch.ones(shape.frames, shape.grid_tokens)
        per_frame[0] = 0
        t = (per_frame.flatten() * t).unsqueeze(0)
    return {
        "hidden_states": video_latents(generator, shape, CONFIG["in_channels"]),
        "timestep": t,
        "encoder_hidden_states": randn(generator, 1, shape.text, CONFIG["text_dim"]),
    }


VIDEO_TORCH_CP = ("its video latents are patchified inside the model and its RoPE positions computed from their "
                  "shape: no input is the token sequence to shard as a buffer")

SPEC = ModelSpec("wan", "WanTransformer3DModel", CONFIG, make_inputs, SHAPES, split_lengths_of=image_stream_only,
                 timestep_scale=TIMESTEP_SCALE, torch_cp_unfit=VIDEO_TORCH_CP)
