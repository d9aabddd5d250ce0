"""Flows on an IP-Adapter, as diffusers' IP-Adapter guide drives one on Flux: `pipe.load_ip_adapter` with the
adapter's weights, `pipe.set_ip_adapter_scale`, `pipe.unload_ip_adapter`, and every call then given the image's
embeddings: the pipeline's own (`ip_adapter_image_embeds=`, a picture), or the transformer's forward as the pipeline
calls it (in `joint_attention_kwargs`). The adapter is tiny and seeded, drawn from the model's own sizes as the zoo
draws its models: an image projection and a key and value projection for each dual-stream block's IP attention; the
image encoder is not built (seeded embeddings stand for its output, as `ip_adapter_image_embeds` lets a user pass
them). Every rank and the one-device run draw the same numbers.

Loading installs IP attention processors in place of every processor the model has (`set_attn_processor`) and
unloading installs fresh ones again: after `enable_parallelism` that is what `processor_after` does.
"""

from __future__ import annotations

from harness.flows.registry import CHANGES, Call, Equivalent, flow

TOKENS = 4  # the image tokens diffusers' Flux IP-Adapter projects an image to (16 only for a 65,536-wide projection)
EMBED_DIM = 16  # the width of the image encoder's embedding the projection takes
SEED, STD = 4321, 0.3  # an adapter that moves the output well beyond any tolerance
SCALE = 0.5  # the scale given to set_ip_adapter_scale
ADAPTER = {"needs_api": ("_load_ip_adapter_weights",), "pipeline_api": ("load_ip_adapter",)}
LOAD = Call("pipe.load_ip_adapter(<a seeded IP-Adapter of every dual-stream block>, weight_name=None, "
            "image_encoder_pretrained_model_name_or_path=None), each call then given ip_adapter_image_embeds", CHANGES)


def adapter_state_dict(module, seed: int = SEED, value_scale: float = 1.0) -> dict:
    """The adapter as `load_ip_adapter` takes a dict: `image_proj` (EMBED_DIM to TOKENS tokens of the model's
    `joint_attention_dim`) and `ip_adapter` (`{i}.to_k_ip` and `{i}.to_v_ip` for each dual-stream block), drawn
    from a fixed seed; `value_scale` multiplies the value projections (what a scale on the IP attention amounts
    to: its output is linear in the values)."""
    import torch

    config, generator = module.config, torch.Generator().manual_seed(seed)
    width, inner = config.joint_attention_dim, config.num_attention_heads * config.attention_head_dim
    projection = {"proj.weight": torch.randn(width * TOKENS, EMBED_DIM, generator=generator) * STD,
                  "proj.bias": torch.randn(width * TOKENS, generator=generator) * STD,
                  "norm.weight": torch.ones(width), "norm.bias": torch.zeros(width)}
    attention = {}
    for block in range(config.num_layers):
        for name, scale in (("to_k_ip", 1.0), ("to_v_ip", value_scale)):
            attention[f"{block}.{name}.weight"] = torch.randn(inner, width, generator=generator) * (STD * scale)
            attention[f"{block}.{name}.bias"] = torch.randn(inner, generator=generator) * (STD * scale)
    return {"image_proj": projection, "ip_adapter": attention}


def _embedding(device, dtype):
    """The image's embedding, as an image encoder would give it for one image: seeded, the same everywhere."""
    import torch

    embeds = torch.randn(1, 1, EMBED_DIM, generator=torch.Generator().manual_seed(SEED + 1)) * STD
    return embeds.to(device, dtype)


def forward_embeds(module, device, dtype) -> dict:
    """What the pipeline hands the transformer with each call once an IP-Adapter is loaded (tensor): the image's
    embedding in `joint_attention_kwargs`; nothing where the model has no image projection (none loaded, or
    unloaded), as a user passes no image then. A fresh dict each call: the transformer pops the embeddings from it."""
    if getattr(module, "encoder_hid_proj", None) is None:
        return {}
    return {"joint_attention_kwargs": {"ip_adapter_image_embeds": [_embedding(device, dtype)]}}


def pipeline_embeds(module, device, dtype) -> dict:
    """What a user passes the pipeline's call once an IP-Adapter is loaded (image): the image's embedding, and a
    negative one (zeros) beside it, without which FluxPipeline encodes a black negative image with the image encoder
    that an adapter loaded from its weights does not have, guided or not (docs/findings.md)."""
    if getattr(module, "encoder_hid_proj", None) is None:
        return {}
    embeds = _embedding(device, dtype)
    return {"ip_adapter_image_embeds": [embeds], "negative_ip_adapter_image_embeds": [embeds * 0]}


INPUTS = {"tensor": forward_embeds, "image": pipeline_embeds}
# a picture: on the case's own pipeline, its own call given the embeddings
PER_KIND = {"inputs": INPUTS, "kinds": tuple(INPUTS)}


def _pipeline(module, setting):
    """The pipeline whose loaders a user calls: the case's own (a picture), or a FluxPipeline around the model with
    no other component (the only pipeline with `load_ip_adapter` around a zoo model: `pipeline_api`)."""
    if setting.pipeline is not None:
        return setting.pipeline
    import inspect

    from transformers.utils import logging

    logging.set_verbosity_error()  # its image processors' notice of a torchvision no one here uses
    from diffusers import FluxPipeline

    others = [name for name in inspect.signature(FluxPipeline.__init__).parameters
              if name not in ("self", "transformer")]
    return FluxPipeline(transformer=module, **dict.fromkeys(others))


def _load(module, setting, value_scale: float = 1.0, pipe=None) -> None:
    weights = adapter_state_dict(module, value_scale=value_scale)
    (pipe or _pipeline(module, setting)).load_ip_adapter(
        weights, weight_name=None, image_encoder_pretrained_model_name_or_path=None)


@flow(LOAD, **ADAPTER, **PER_KIND)
def ip_adapter(module, setting):
    _load(module, setting)


@flow(LOAD, Call(f"pipe.set_ip_adapter_scale({SCALE})", CHANGES), **ADAPTER, inputs=INPUTS,
      equals=Equivalent(f"the IP-Adapter loaded with its value projections times {SCALE}",
                        lambda module, setting: _load(module, setting, value_scale=SCALE)))
def ip_adapter_scaled(module, setting):
    pipe = _pipeline(module, setting)
    _load(module, setting, pipe=pipe)
    yield
    pipe.set_ip_adapter_scale(SCALE)
    yield


@flow(LOAD, Call("pipe.unload_ip_adapter(): the plain model back, called with no image", CHANGES), **ADAPTER,
      inputs=INPUTS, equals=Equivalent("the plain model"))
def ip_adapter_unload(module, setting):
    pipe = _pipeline(module, setting)
    _load(module, setting, pipe=pipe)
    yield
    pipe.unload_ip_adapter()
    yield
