"""LTX-2: `LTX2VideoTransformer3DModel`, joint video + audio streams with per-modality text and cross-modal attention.

Only the video stream is in the `_cp_plan` (video tokens, video text and its mask); audio tokens stay whole on
every rank. With cross-modal attention on, as `LTX2Pipeline` runs it (`isolate_modalities=False`), the audio
stream attends to each rank's video shard only; "isolated" sets `isolate_modalities=True` (LTX-2.3 modality
guidance) to check the video path alone. The pipeline's text connector turns the prompt mask into all ones
(learned registers replace padding); "default" passes None, "masked" a padded prompt's mask. The harness
compares output [0], the video prediction; the audio prediction is returned second and not compared.
"""

from harness.catalogue.zoo import ltx
from harness.catalogue.zoo.spec import ModelSpec, Shape, padded_text, randn, shapes, text_mask, timestep

AUDIO_LATENTS = 9  # odd on purpose: audio is never split, so its length must not matter

TIMESTEP_SCALE = 1000.0  # the pipeline passes sigma * 1000 as `timestep`

CONFIG = {
    "in_channels": 4,
    "out_channels": 4,
    "num_attention_heads": 4,
    "attention_head_dim": 8,
    "cross_attention_dim": 32,
    "audio_in_channels": 4,
    "audio_out_channels": 4,
    "audio_num_attention_heads": 4,
    "audio_attention_head_dim": 4,
    "audio_cross_attention_dim": 16,
    "num_layers": 2,
    "caption_channels": 16,
}

# LTX's shapes, plus the pipeline variant that keeps audio and video apart in attention.
SHAPES = shapes(*ltx.SHAPES.values(), Shape("isolated", frames=2, options=("isolate_modalities",)))


def make_inputs(generator, shape: Shape):
    mask = text_mask(shape) if shape.masked else None
    t = TIMESTEP_SCALE * timestep(generator)
    return {
        "hidden_states": randn(generator, 1, shape.image_tokens, CONFIG["in_channels"]),
        "audio_hidden_states": randn(generator, 1, AUDIO_LATENTS, CONFIG["audio_in_channels"]),
        "encoder_hidden_states": padded_text(generator, shape, CONFIG["caption_channels"]),
        "audio_encoder_hidden_states": padded_text(generator, shape, CONFIG["caption_channels"]),
        "timestep": t,
        "sigma": t.clone(),  # a separate tensor: safetensors refuses inputs that share memory
        "encoder_attention_mask": mask,
        "audio_encoder_attention_mask": None if mask is None else mask.clone(),
        "num_frames": shape.frames,
        "height": shape.height,
        "width": shape.width,
        "fps": 24.0,
        "audio_num_frames": AUDIO_LATENTS,
        "isolate_modalities": shape.has("isolate_modalities"),
    }


SPEC = ModelSpec("ltx2", "LTX2VideoTransformer3DModel", CONFIG, make_inputs, SHAPES,
                 timestep_scale=TIMESTEP_SCALE, timestep_keys=("timestep", "sigma"),
                 cache_contexts=("cond_uncond",),  # LTX2Pipeline runs both branches as one batch, in one context
                 torch_cp_unfit="its RoPE positions are computed inside the model from `num_frames`, `height`, "
                                "`width` and `audio_num_frames`: sharded tokens would get the first chunk's "
                                "positions on every rank")
