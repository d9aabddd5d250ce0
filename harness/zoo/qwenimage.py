"""Qwen-Image: `QwenImageTransformer2DModel`, 2x2-patched latents, text mask and `img_shapes`."""

import torch

from harness.zoo.spec import ModelSpec, Shape, randn

CONFIG = {
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 16,
    "guidance_embeds": False,
    "axes_dims_rope": [8, 4, 4],
}


def make_inputs(generator, shape: Shape):
    return {
        "hidden_states": randn(generator, 1, shape.image_tokens, CONFIG["in_channels"]),
        "encoder_hidden_states": randn(generator, 1, shape.text, CONFIG["joint_attention_dim"]),
        "timestep": randn(generator, 1).abs().clamp(max=1.0),
        "img_shapes": [(1, shape.height, shape.width)],
    }


SPEC = ModelSpec("qwenimage", "QwenImageTransformer2DModel", CONFIG, make_inputs, {"default": Shape(text=8)})
