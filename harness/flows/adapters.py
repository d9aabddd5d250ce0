"""Flows on adapters: a LoRA loaded the way diffusers' LoRA guide loads one (`load_lora_adapter`, what a pipeline's
`load_lora_weights` calls on its transformer), scaled with `set_adapters`, fused with `fuse_lora`, unloaded again,
hot-swapped for another, and PEFT's own `add_adapter` (the training scripts' way). Every rank and the one-device run
get the same seeded adapter weights."""

from __future__ import annotations

from harness.flows.registry import AFTER, BEFORE, Refused, flow

ADAPTER = "harness"
TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # the attention projections every zoo model has
RANK, SEED, STD = 2, 1234, 0.3  # a LoRA that moves the output well beyond any tolerance

TP_MODULE = "diffusers.hooks.tensor_parallel"
LOADED_BEFORE_TP = Refused(BEFORE, "tp", "has adapter (LoRA) layers injected", TP_MODULE,
                           "_check_tp_supported, from enable_parallelism")
LOADED_AFTER_TP = Refused(AFTER, "tp", "have a LoRA adapter loaded", "diffusers.loaders.peft",
                          "_raise_if_tensor_parallel, from load_lora_adapter")
LORA = {"needs": ("peft",), "needs_api": ("load_lora_adapter",), "changes_numbers": True,
        "refused": (LOADED_BEFORE_TP, LOADED_AFTER_TP)}


def lora_state_dict(module, seed: int = SEED) -> dict:
    """A diffusers-format LoRA for every targeted projection of `module` (`<name>.lora_A.weight`, `.lora_B.weight`),
    drawn from a fixed seed in the order of the module's names: the same on every rank and every process."""
    import torch

    generator, weights = torch.Generator().manual_seed(seed), {}
    for name, found in module.named_modules():
        if isinstance(found, torch.nn.Linear) and name.endswith(TARGETS):
            weights[f"{name}.lora_A.weight"] = torch.randn(RANK, found.in_features, generator=generator) * STD
            weights[f"{name}.lora_B.weight"] = torch.randn(found.out_features, RANK, generator=generator) * STD
    return weights


def _load(module, setting, seed: int = SEED, hotswap: bool = False) -> None:
    weights = {key: value.to(setting.device, setting.dtype) for key, value in lora_state_dict(module, seed).items()}
    module.load_lora_adapter(weights, adapter_name=ADAPTER, prefix=None, hotswap=hotswap)


@flow("model.load_lora_adapter(<a seeded LoRA of every attention projection>, adapter_name='harness')", **LORA,
      kinds=("tensor", "image"))  # image: on the pipeline's transformer, what `pipe.load_lora_weights` does
def lora(module, setting):
    _load(module, setting)


@flow("model.load_lora_adapter(...), then model.set_adapters(['harness'], weights=[0.5])", **LORA)
def lora_scaled(module, setting):
    _load(module, setting)
    module.set_adapters([ADAPTER], weights=[0.5])


@flow("model.load_lora_adapter(...), then model.fuse_lora(lora_scale=0.7): the adapter merged into the weights", **LORA)
def lora_fused(module, setting):
    _load(module, setting)
    module.fuse_lora(lora_scale=0.7, adapter_names=[ADAPTER])


@flow("model.load_lora_adapter(...), then model.unload_lora(): the plain model back", needs=("peft",),
      needs_api=("load_lora_adapter", "unload_lora"), keeps_numbers=True, refused=(LOADED_AFTER_TP,))
def lora_unload(module, setting):
    _load(module, setting)
    module.unload_lora()


@flow("model.enable_lora_hotswap(target_rank=4), model.load_lora_adapter(...), then another LoRA loaded in its place "
      "with load_lora_adapter(..., hotswap=True)",
      **{**LORA, "needs_api": ("load_lora_adapter", "enable_lora_hotswap")})
def lora_hotswap(module, setting):
    module.enable_lora_hotswap(target_rank=2 * RANK)
    _load(module, setting)
    _load(module, setting, seed=SEED + 1, hotswap=True)


@flow("model.add_adapter(LoraConfig(r=2, target_modules=[to_q, to_k, to_v, to_out.0], init_lora_weights=False)): "
      "PEFT's way, as diffusers' training scripts add a LoRA", needs=("peft",), needs_api=("add_adapter",),
      changes_numbers=True, refused=(LOADED_BEFORE_TP,), kinds=("tensor", "train"))  # train: only the adapter trains
def add_adapter(module, setting):
    import torch
    from peft import LoraConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)  # PEFT draws the adapter's weights from the global generator: the same everywhere
        module.add_adapter(LoraConfig(r=RANK, lora_alpha=RANK, target_modules=list(TARGETS),
                                      init_lora_weights=False), adapter_name=ADAPTER)
