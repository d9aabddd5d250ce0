"""ChronoEdit: `ChronoEditTransformer3DModel`, Wan-like I2V with CLIP image embeddings and a skip-frame rope.

The pipeline always passes CLIP image embeddings (257 tokens in production, an odd count kept odd here) and T5
text padded to 512 tokens; the attention processor finds the image tokens as `len - 512`, so the text length is
fixed at 512 and there is no "txt7" shape. Editing runs on 2 latent frames (input and output image), which takes
the rope's temporal-skip branch; temporal reasoning runs on more frames ("img45": 3 frames of 3x5).
"""

from harness.catalogue.zoo.spec import ModelSpec, Shape, image_stream_only, randn, shapes, timestep
from harness.catalogue.zoo.wan import video_latents

TEXT_TOKENS = 512  # hard-coded in the ChronoEdit/Wan I2V attention processor
IMAGE_EMBED_TOKENS = 9

TIMESTEP_SCALE = 1000.0  # the pipeline passes sigma * 1000 as `timestep`

CONFIG = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 4,
    "attention_head_dim": 8,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 32,
    "freq_dim": 16,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "image_dim": 16,
    "added_kv_proj_dim": 32,
    "rope_max_seq_len": 64,
    "rope_temporal_skip_len": 8,
}

SHAPES = shapes(
    Shape("default", frames=2, text=TEXT_TOKENS),
    Shape("img45", frames=3, height=3, width=5, text=TEXT_TOKENS),
)


def make_inputs(generator, shape: Shape):
    return {
        "hidden_states": video_latents(generator, shape, CONFIG["in_channels"]),
        "timestep": TIMESTEP_SCALE * timestep(generator),
        "encoder_hidden_states": randn(generator, 1, shape.text, CONFIG["text_dim"]),
        "encoder_hidden_states_image": randn(generator, 1, IMAGE_EMBED_TOKENS, CONFIG["image_dim"]),
    }


SPEC = ModelSpec("chronoedit", "ChronoEditTransformer3DModel", CONFIG, make_inputs, SHAPES,
                 split_lengths_of=image_stream_only, timestep_scale=TIMESTEP_SCALE,
                 cache_contexts=("cond",),  # ChronoEditPipeline opens none: a cache flow's loop opens one
                 torch_cp_unfit="its video latents are patchified inside the model and its RoPE positions "
                                "computed from their shape: no input is the token sequence to shard as a buffer")
