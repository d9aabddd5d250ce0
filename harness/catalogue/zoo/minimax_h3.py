"""MiniMax-H3: `MiniMaxH3Transformer3DModel`, one packed sequence [text | audio | video] with per-row tags.

The layout comes from the modular pipeline's own builders (`MiniMaxH3PrepareLayoutStep.build_packed_sequence`
for the t2va task and `MiniMaxH3SetTimestepsStep.build_row_timesteps`), so positions, modality tags and per-row
timestep indices are exactly what the pipeline passes. Context parallelism splits the whole packed sequence:
text + audio rows + video rows must divide by the degree. Stereo audio is packed channel-major (2 rows per
audio latent). There is no text mask: the packed sequence carries no padding. The harness compares output [0],
the video prediction; the audio prediction is returned second and not compared.
"""

import torch

from harness.catalogue.zoo.spec import ModelSpec, Shape, randn, shapes

AUDIO_LATENTS = 4  # per channel
VIDEO_T, AUDIO_T = 0.7, 0.6  # distinct, as the video and audio schedulers give them, so adaln_indices vary

CONFIG = {
    "num_attention_heads": 4,
    "attention_head_dim": 16,
    "hidden_size": 24,
    "num_layers": 2,
    "num_refiner_layers": 2,
    "ffn_dim": 32,
    "in_channels": 4,
    "audio_in_channels": 6,
    "patch_size": [1, 2, 2],
    "text_dim": 8,
    "freq_dim": 32,
    "time_embed_hidden_dim": 24,
    "time_embed_dim": 16,
    "rope_freq_dim": 2,
}

# default: 8 text + 8 audio rows + 2 frames x 16 video rows = 48, divisible by 4.
SHAPES = shapes(
    Shape("default", frames=2),
    Shape("txt7", frames=2, text=7),
    Shape("img15", height=3, width=5),
)


def layout(shape: Shape) -> dict[str, torch.Tensor]:
    """The t2va packed layout and per-row timesteps, built by the pipeline's own static methods."""
    from diffusers.modular_pipelines.minimax_h3 import before_denoise as steps
    from diffusers.modular_pipelines.minimax_h3 import modular_pipeline as pipe

    patch = tuple(CONFIG["patch_size"])
    text_tags = torch.full((shape.text,), pipe.MINIMAX_H3_TEXT_TAG)
    position_ids, token_tags, video_indices, audio_indices, text_indices, _, _ = (
        steps.MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            text_tags, shape.frames, patch[1] * shape.height, patch[2] * shape.width, AUDIO_LATENTS, patch,
            pipe.MINIMAX_H3_AUDIO_CHANNELS, pipe.MINIMAX_H3_AUDIO_TAG, pipe.MINIMAX_H3_VIDEO_TAG,
        )
    )
    unique_t, timestep_indices = steps.MiniMaxH3SetTimestepsStep.build_row_timesteps(
        video_indices, audio_indices, 0, 0, shape.text, VIDEO_T, AUDIO_T, 1.0, 1.0
    )
    return {
        "timestep": unique_t,
        "timestep_indices": timestep_indices,
        "token_tags": token_tags,
        "position_ids": position_ids.float(),  # float64 in the pipeline; the rope casts to float32 first
        "video_indices": video_indices,
        "audio_indices": audio_indices,
        "text_indices": text_indices,
    }


def make_inputs(generator, shape: Shape):
    video_patch = CONFIG["in_channels"] * 4
    audio_rows = 2 * AUDIO_LATENTS
    return {
        "hidden_states": randn(generator, 1, shape.image_tokens, video_patch),
        "audio_hidden_states": randn(generator, 1, audio_rows, CONFIG["audio_in_channels"]),
        "encoder_hidden_states": randn(generator, 1, shape.text, CONFIG["text_dim"]),
        **layout(shape),
    }


def packed_length(shape: Shape) -> dict[str, int]:
    """Context parallelism splits the one packed sequence: text + audio rows + video rows."""
    return {"packed tokens": shape.text + 2 * AUDIO_LATENTS + shape.image_tokens}


SPEC = ModelSpec("minimax_h3", "MiniMaxH3Transformer3DModel", CONFIG, make_inputs, SHAPES,
                 split_lengths_of=packed_length,
                 cache_contexts=("cond",),  # no diffusers pipeline runs it: a cache flow's loop opens one context
                 untrainable="its `timestep` holds one value per packed row (video, audio), not one per sample, and "
                             "the packed sequence mixes modalities: the flow-matching recipe needs the pipeline's row "
                             "bookkeeping, which the zoo does not model",
                 torch_cp_unfit="it packs video, audio and text into one sequence by index tensors over the whole "
                                "packed sequence (`video_indices`, `token_tags`, ...), which no per-buffer sharding "
                                "keeps consistent")
