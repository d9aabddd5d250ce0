"""Qwen-Image: `QwenImageTransformer2DModel`, 2x2-patched latents, text mask and `img_shapes`.

The pipeline drops the mask when every token is valid (`prompt_embeds_mask.all()` -> None), so only the "masked"
shape passes one; it is the path that splits `encoder_hidden_states_mask` under context parallelism.
"""

from harness.zoo.spec import ModelSpec, Shape, padded_text, randn, shapes, text_mask

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

SHAPES = shapes(
    Shape("default"),
    Shape("txt7", text=7),
    Shape("img15", height=3, width=5),
    Shape("masked", masked=3),
)


def make_inputs(generator, shape: Shape):
    inputs = {
        "hidden_states": randn(generator, 1, shape.image_tokens, CONFIG["in_channels"]),
        "encoder_hidden_states": padded_text(generator, shape, CONFIG["joint_attention_dim"]),
        "timestep": randn(generator, 1).abs().clamp(max=1.0),
        "img_shapes": [(1, shape.height, shape.width)],
    }
    if shape.masked:
        inputs["encoder_hidden_states_mask"] = text_mask(shape)
    return inputs


SPEC = ModelSpec("qwenimage", "QwenImageTransformer2DModel", CONFIG, make_inputs, SHAPES)
