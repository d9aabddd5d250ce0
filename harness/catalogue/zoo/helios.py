"""Helios: `HeliosTransformer3DModel`, Wan-like video chunks conditioned on short/mid/long history latents.

Inputs follow `HeliosPipeline` with its default `history_sizes=[16, 2, 1]` and `keep_first_frame=True`: a zero
prefix frame plus the 1x history form the short history, mid and long histories are patched 2x and 4x coarser,
and each stream gets the frame indices the pipeline splits from one `arange`. History tokens are prepended to the
chunk's tokens, so context parallelism splits history + chunk in self-attention and the chunk alone in
cross-attention. The class's `_cp_plan` names `blocks.0` ... `blocks.39` explicitly; `cp_plan` prunes it to
the blocks this tiny config has.
"""

import re

import torch

from harness.catalogue.zoo.spec import ModelSpec, Shape, randn, shapes, timestep
from harness.catalogue.zoo.wan import CONFIG as WAN_CONFIG
from harness.catalogue.zoo.wan import video_latents

HISTORY_SIZES = (16, 2, 1)  # long, mid, 1x: HeliosPipeline's defaults

TIMESTEP_SCALE = 1000.0  # the pipeline passes sigma * 1000 as `timestep`

# Wan's tiny config: Helios's class has no `rope_max_seq_len`, its RoPE takes a dim per axis (frames, height, width).
CONFIG = {**{key: value for key, value in WAN_CONFIG.items() if key != "rope_max_seq_len"}, "rope_dim": [4, 4, 4]}

# default: 4 long + 4 mid + 32 short history tokens + 32 chunk tokens = 72, divisible by 4 like the chunk alone.
SHAPES = shapes(
    Shape("default", frames=2),
    Shape("txt7", frames=2, text=7),
    Shape("img15", height=3, width=5),
)

_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.")


def pruned_cp_plan(config: dict) -> dict:
    """The class's `_cp_plan` without entries for blocks the config does not build (else "'2' is not a submodule")."""
    import diffusers

    plan = diffusers.HeliosTransformer3DModel._cp_plan
    layers = config["num_layers"]
    kept = {}
    for key, value in plan.items():
        match = _BLOCK_KEY.match(key)
        if match is None or int(match.group(1)) < layers:
            kept[key] = value
    return kept


def frame_indices(frames: int) -> dict[str, torch.Tensor]:
    """The pipeline's split of one `arange` into prefix, long, mid, 1x and chunk frames (keep_first_frame)."""
    long, mid, one = HISTORY_SIZES
    prefix, long_idx, mid_idx, one_idx, chunk = torch.arange(1 + long + mid + one + frames).split(
        [1, long, mid, one, frames]
    )
    return {
        "indices_hidden_states": chunk.unsqueeze(0),
        "indices_latents_history_short": torch.cat([prefix, one_idx]).unsqueeze(0),
        "indices_latents_history_mid": mid_idx.unsqueeze(0),
        "indices_latents_history_long": long_idx.unsqueeze(0),
    }


def make_inputs(generator, shape: Shape):
    channels, (long, mid, one) = CONFIG["in_channels"], HISTORY_SIZES
    history = Shape(frames=long + mid + one, height=shape.height, width=shape.width)
    history_long, history_mid, history_one = video_latents(generator, history, channels).split([long, mid, one], 2)
    prefix = torch.zeros_like(history_one)  # text-to-video first chunk: no image latents yet
    return {
        "hidden_states": video_latents(generator, shape, channels),
        "timestep": TIMESTEP_SCALE * timestep(generator),
        "encoder_hidden_states": randn(generator, 1, shape.text, CONFIG["text_dim"]),
        **frame_indices(shape.frames),
        "latents_history_short": torch.cat([prefix, history_one], dim=2),
        "latents_history_mid": history_mid,
        "latents_history_long": history_long,
    }


def history_and_chunk(shape: Shape) -> dict[str, int]:
    """Helios splits the history latents together with the chunk; their patched lengths are not modelled here, so
    the plan predicts no uneven split and diffusers' own error decides."""
    return {}


TORCH_CP_UNFIT = ("its video latents and their history are patchified inside the model and its RoPE positions "
                  "computed from their shapes and frame indices: no input is the token sequence to shard")

SPEC = ModelSpec("helios", "HeliosTransformer3DModel", CONFIG, make_inputs, SHAPES, cp_plan=pruned_cp_plan,
                 split_lengths_of=history_and_chunk, timestep_scale=TIMESTEP_SCALE, torch_cp_unfit=TORCH_CP_UNFIT)

# The same class with `is_amplify_history=True`: its attention processor derives the history length from the
# rank's local sequence and the full-sequence `original_context_length`, which context parallelism makes disagree.
AMPLIFY_SPEC = ModelSpec("helios_amplify", "HeliosTransformer3DModel", {**CONFIG, "is_amplify_history": True},
                         make_inputs, shapes(Shape("default", frames=2)), cp_plan=pruned_cp_plan,
                         split_lengths_of=history_and_chunk, timestep_scale=TIMESTEP_SCALE,
                         torch_cp_unfit=TORCH_CP_UNFIT)
