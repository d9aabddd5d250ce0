"""FLUX.2: `Flux2Transformer2DModel` with guidance and 4-axis (t, h, w, l) position ids.

Like Flux, no text mask reaches the transformer, so there is no "masked" shape.
"""

import torch

from harness.catalogue.zoo.spec import ModelSpec, Shape, image_grid_ids, randn, shapes

CONFIG = {
    "patch_size": 1,
    "in_channels": 4,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 32,
    "timestep_guidance_channels": 256,
    "axes_dims_rope": [4, 4, 4, 4],
}

SHAPES = shapes(Shape("default"), Shape("txt7", text=7), Shape("img15", height=3, width=5))


def make_inputs(generator, shape: Shape):
    text_ids = torch.zeros(shape.text, 4)
    text_ids[:, 3] = torch.arange(shape.text)
    return {
        "hidden_states": randn(generator, 1, shape.image_tokens, CONFIG["in_channels"]),
        "encoder_hidden_states": randn(generator, 1, shape.text, CONFIG["joint_attention_dim"]),
        "img_ids": image_grid_ids(shape.height, shape.width, extra_axes=1).unsqueeze(0),
        "txt_ids": text_ids.unsqueeze(0),
        "timestep": randn(generator, 1).abs().clamp(max=1.0),
        "guidance": torch.tensor([3.5]),
    }


# As Flux (harness/catalogue/zoo/flux.py): each stream and its position ids sharded alike; here the ids carry a
# batch axis. `timestep` and `guidance` have no sequence: whole.
TORCH_CP_BUFFERS = {"hidden_states": 1, "encoder_hidden_states": 1, "img_ids": 1, "txt_ids": 1}

# Flux2Pipeline is guidance-distilled and opens no cache context (a cache then raises "No cache context is set"):
# a cache flow's loop opens one, as diffusers' caching guide asks of a loop of one's own
SPEC = ModelSpec("flux2", "Flux2Transformer2DModel", CONFIG, make_inputs, SHAPES, torch_cp_buffers=TORCH_CP_BUFFERS,
                 cache_contexts=("cond",))
