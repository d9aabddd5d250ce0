"""LTX-Video: `LTXVideoTransformer3DModel`, pre-packed video tokens (B, F*H*W, C) and T5 text with its mask.

The `_cp_plan` splits video tokens, text tokens and the text mask at the model input, so both lengths must
divide by the degree. The pipeline pads prompts and always passes the mask; "default" passes None (a prompt
without padding, which the model treats the same as an all-ones mask) so the mask-free path is checked on its
own, and "masked" passes the padded prompt's real mask.
"""

from harness.catalogue.zoo.spec import ModelSpec, Shape, padded_text, randn, shapes, text_mask, timestep

TIMESTEP_SCALE = 1000.0  # the pipeline passes sigma * 1000 as `timestep`

CONFIG = {
    "in_channels": 4,
    "out_channels": 4,
    "num_attention_heads": 4,
    "attention_head_dim": 8,
    "cross_attention_dim": 32,
    "num_layers": 1,
    "caption_channels": 16,
}

SHAPES = shapes(
    Shape("default", frames=2),
    Shape("txt7", frames=2, text=7),
    Shape("img15", height=3, width=5),
    Shape("masked", frames=2, masked=3),
)

# LTXPipeline: (temporal compression / frame_rate, spatial compression, spatial compression) at 25 fps.
ROPE_INTERPOLATION_SCALE = (8 / 25, 32, 32)


def make_inputs(generator, shape: Shape):
    inputs = {
        "hidden_states": randn(generator, 1, shape.image_tokens, CONFIG["in_channels"]),
        "encoder_hidden_states": padded_text(generator, shape, CONFIG["caption_channels"]),
        "timestep": TIMESTEP_SCALE * timestep(generator),
        "encoder_attention_mask": text_mask(shape) if shape.masked else None,
        "num_frames": shape.frames,
        "height": shape.height,
        "width": shape.width,
        "rope_interpolation_scale": ROPE_INTERPOLATION_SCALE,
    }
    return inputs


SPEC = ModelSpec("ltx", "LTXVideoTransformer3DModel", CONFIG, make_inputs, SHAPES, timestep_scale=TIMESTEP_SCALE,
                 cache_contexts=("cond_uncond",),  # LTXPipeline runs both branches as one batch, in one context
                 torch_cp_unfit="its RoPE positions are computed inside the model from `num_frames`, `height` "
                                "and `width`: sharded tokens would get the first chunk's positions on every rank")
