"""FLUX.1: `FluxTransformer2DModel` (config adapted from diffusers' own model tests, 4 heads for degree 4).

Flux takes no text mask: its pipeline always passes the full T5 sequence, so there is no "masked" shape.
"""

from harness.catalogue.zoo.spec import ModelSpec, Shape, image_grid_ids, randn, shapes

CONFIG = {
    "patch_size": 1,
    "in_channels": 4,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
    "axes_dims_rope": [4, 4, 8],
}

# Image and text tokens are both split by context parallelism, so each odd length gets its own shape.
SHAPES = shapes(Shape("default"), Shape("txt7", text=7), Shape("img15", height=3, width=5))


def make_inputs(generator, shape: Shape):
    return {
        "hidden_states": randn(generator, 1, shape.image_tokens, CONFIG["in_channels"]),
        "encoder_hidden_states": randn(generator, 1, shape.text, CONFIG["joint_attention_dim"]),
        "pooled_projections": randn(generator, 1, CONFIG["pooled_projection_dim"]),
        "img_ids": image_grid_ids(shape.height, shape.width),
        "txt_ids": image_grid_ids(1, shape.text).zero_(),
        "timestep": randn(generator, 1).abs().clamp(max=1.0),
    }


# PyTorch's context parallelism shards each of these along its sequence dim, rank r keeping chunk r of each: the
# joint attention then sees [text chunk r, image chunk r] on rank r, and non-causal unmasked attention does not care
# in which order the ring brings the other ranks' keys. The position ids must be sharded exactly like their tokens,
# or RoPE rotates a token by another token's position. `pooled_projections` and `timestep` have no sequence: whole.
TORCH_CP_BUFFERS = {
    "hidden_states": 1,  # (batch, image tokens, channels)
    "encoder_hidden_states": 1,  # (batch, text tokens, dim)
    "img_ids": 0,  # (image tokens, 3): the positions of hidden_states' tokens
    "txt_ids": 0,  # (text tokens, 3): the positions of encoder_hidden_states' tokens
}

SPEC = ModelSpec("flux", "FluxTransformer2DModel", CONFIG, make_inputs, SHAPES, torch_cp_buffers=TORCH_CP_BUFFERS)
