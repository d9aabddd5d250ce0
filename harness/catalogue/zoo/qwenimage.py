"""Qwen-Image: `QwenImageTransformer2DModel`, 2x2-patched latents, text mask and `img_shapes`.

The pipeline drops the mask when every token is valid (`prompt_embeds_mask.all()` -> None), so only the "masked"
shape passes one; it is the path that splits `encoder_hidden_states_mask` under context parallelism.

diffusers 0.36 requires `txt_seq_lens` (the RoPE's text length); 0.37 on read it from the text. The inputs stay those
of the current release (references are shared across releases); `with_036_call` calls the model as 0.36's pipeline does.
"""

import functools

from harness.catalogue.zoo.spec import ModelSpec, Shape, padded_text, randn, shapes, text_mask
from harness.core import compat

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


@functools.cache
def _as_036_pipeline_calls(cls: type, fill_lens: bool, fill_mask: bool) -> type:
    def __call__(self, *args, **kwargs):
        # Runs before diffusers' hooks split the inputs under context parallelism, so the RoPE covers the whole
        # text, as 0.37+ compute it (the text length, padding included) and as 0.36's pipeline passes it for one
        # unpadded prompt. What a caller passes itself (0.36's own pipeline) is kept.
        text = kwargs.get("encoder_hidden_states")
        if fill_lens and kwargs.get("txt_seq_lens") is None and text is not None:
            kwargs["txt_seq_lens"] = [text.shape[1]] * text.shape[0]
        if fill_mask:
            kwargs.setdefault("encoder_hidden_states_mask", None)
        return super(subclass, self).__call__(*args, **kwargs)

    doc = f"{cls.__name__}, called the way diffusers 0.36's QwenImagePipeline calls it."
    subclass = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": __name__, "__doc__": doc})
    return subclass


def with_036_call(cls: type) -> type:
    """`cls` itself on 0.37 and later. On 0.36, a subclass that passes what 0.36's pipeline passes: the required
    `txt_seq_lens`, and `encoder_hidden_states_mask` (None when absent), because 0.36's context-parallel split hook
    refuses a call that omits an input its plan names ("Expected 2 arguments but got 0")."""
    fill_lens = not compat.has("qwenimage_txt_seq_lens_optional")
    fill_mask = "encoder_hidden_states_mask" in ((getattr(cls, "_cp_plan", None) or {}).get("") or {})
    return _as_036_pipeline_calls(cls, fill_lens, fill_mask) if fill_lens or fill_mask else cls


QWEN_TORCH_CP = ("its RoPE positions are computed inside the model from `img_shapes` and the text length "
                 "(QwenEmbedRope): sharded tokens would get the first chunk's positions on every rank")

SPEC = ModelSpec("qwenimage", "QwenImageTransformer2DModel", CONFIG, make_inputs, SHAPES,
                 compat_class=with_036_call, torch_cp_unfit=QWEN_TORCH_CP)
