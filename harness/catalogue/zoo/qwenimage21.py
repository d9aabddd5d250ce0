"""Qwen-Image 2.1: `QwenImage21Transformer2DModel`, one joint text+image stream with block-causal attention.

Tensor parallel only (no `_cp_plan`). Text-to-image as `QwenImage21Pipeline` calls it: `img_mask` marks one slot
per 2x2 group of target latents appended after the text, `img_shapes` is per-sample lists of (frame, h, w), the
timestep is in [0, 1], and the prompt mask is dropped when all ones (only "masked" passes one). Latents are
grouped 2x2, so the image grid must be even and there is no odd image shape. The KV cache is not exercised.
"""

import torch

from harness.catalogue.zoo.spec import ModelSpec, Shape, padded_text, randn, shapes, text_mask, timestep

CONFIG = {
    "patch_size": 1,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "context_in_dim": 32,
    "mlp_ratio": 3,
    "axes_dims_rope": [4, 6, 6],
}

SHAPES = shapes(
    Shape("default"),
    Shape("txt7", text=7),
    Shape("img24", height=4, width=6),
    Shape("masked", masked=3),
)


def make_inputs(generator, shape: Shape):
    slots = shape.image_tokens // 4  # one vision-encoder slot per 2x2 latent group
    img_mask = torch.cat([torch.zeros(1, shape.text, dtype=torch.bool), torch.ones(1, slots, dtype=torch.bool)], 1)
    inputs = {
        "hidden_states": randn(generator, 1, shape.image_tokens, CONFIG["in_channels"]),
        "encoder_hidden_states": padded_text(generator, shape, CONFIG["context_in_dim"]),
        "timestep": timestep(generator),
        "img_shapes": [[(1, shape.height, shape.width)]],
        "img_mask": img_mask,
    }
    if shape.masked:
        inputs["encoder_hidden_states_mask"] = text_mask(shape).bool()
    return inputs


SPEC = ModelSpec("qwenimage21", "QwenImage21Transformer2DModel", CONFIG, make_inputs, SHAPES,
                 untrainable="its output is not shaped like `hidden_states` (24 tokens for 16 latent tokens here), "
                             "so the flow-matching target needs the pipeline's own unpacking, which the zoo does not "
                             "model",
                 torch_cp_unfit="its RoPE positions come from `img_shapes` inside the model and it takes an "
                                "`img_mask`, which PyTorch's CP ring does not take")
