"""Flows on adapters: a LoRA loaded the way diffusers' LoRA guide loads one (`load_lora_adapter`, what a pipeline's
`load_lora_weights` calls on its transformer), scaled with `set_adapters`, fused with `fuse_lora`, unloaded again,
hot-swapped for another, and PEFT's own `add_adapter` (the training scripts' way). Every rank and the one-device run
get the same seeded adapter weights."""

from __future__ import annotations

from harness.flows.registry import AFTER, BEFORE, CHANGES, Call, Equivalent, Refused, flow

ADAPTER = "harness"
TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # the attention projections every zoo model has
RANK, SEED, STD = 2, 1234, 0.3  # a LoRA that moves the output well beyond any tolerance
SCALE, FUSED_SCALE = 0.5, 0.7  # the weights given to set_adapters, and the scale fuse_lora merges with

TP_MODULE = "diffusers.hooks.tensor_parallel"
LOADED_BEFORE_TP = Refused(BEFORE, "tp", "has adapter (LoRA) layers injected", TP_MODULE,
                           "_check_tp_supported, from enable_parallelism")
LOADED_AFTER_TP = Refused(AFTER, "tp", "have a LoRA adapter loaded", "diffusers.loaders.peft",
                          "_raise_if_tensor_parallel, from load_lora_adapter")
LORA = {"needs": ("peft",), "needs_api": ("load_lora_adapter",), "refused": (LOADED_BEFORE_TP, LOADED_AFTER_TP)}
LOAD = Call("model.load_lora_adapter(<a seeded LoRA of every attention projection>, adapter_name='harness')", CHANGES)


def lora_state_dict(module, seed: int = SEED, scale_b: float = 1.0) -> dict:
    """A diffusers-format LoRA for every targeted projection of `module` (`<name>.lora_A.weight`, `.lora_B.weight`),
    drawn from a fixed seed in the order of the module's names: the same on every rank and every process, and the
    same keys once an adapter wraps the projections (PEFT's layer keeps the projection's name and sizes)."""
    import torch

    generator, weights = torch.Generator().manual_seed(seed), {}
    for name, found in module.named_modules():
        if name.endswith(TARGETS) and hasattr(found, "in_features") and hasattr(found, "out_features"):
            weights[f"{name}.lora_A.weight"] = torch.randn(RANK, found.in_features, generator=generator) * STD
            drawn = torch.randn(found.out_features, RANK, generator=generator)
            weights[f"{name}.lora_B.weight"] = drawn * (STD * scale_b)
    return weights


def _load(module, setting, seed: int = SEED, hotswap: bool = False, scale_b: float = 1.0) -> None:
    weights = {key: value.to(setting.device, setting.dtype)
               for key, value in lora_state_dict(module, seed, scale_b).items()}
    if not weights:  # a LoRA of no layer is loaded without a word: the case would test nothing
        raise RuntimeError(f"the harness found no projection named {', '.join(TARGETS)} to draw a LoRA for")
    module.load_lora_adapter(weights, adapter_name=ADAPTER, prefix=None, hotswap=hotswap)


# image: on the pipeline's transformer, what `pipe.load_lora_weights` does
@flow(LOAD, **LORA, kinds=("tensor", "image"), quick_compiled=True)
def lora(module, setting):
    _load(module, setting)


@flow(LOAD, Call(f"model.set_adapters(['harness'], weights=[{SCALE}])", CHANGES), **LORA,
      equals=Equivalent(f"the LoRA loaded with its lora_B weights times {SCALE}",
                        lambda module, setting: _load(module, setting, scale_b=SCALE)))
def lora_scaled(module, setting):
    _load(module, setting)
    yield
    module.set_adapters([ADAPTER], weights=[SCALE])
    yield


def _scaled_by(scale: float):
    def load_then_scale(module, setting):
        _load(module, setting)
        module.set_adapters([ADAPTER], weights=[scale])

    return load_then_scale


@flow(LOAD, Call(f"model.fuse_lora(lora_scale={FUSED_SCALE}): the adapter merged into the weights", CHANGES), **LORA,
      equals=Equivalent(f"the LoRA loaded and set to {FUSED_SCALE} with set_adapters, unfused",
                        _scaled_by(FUSED_SCALE)))
def lora_fused(module, setting):
    _load(module, setting)
    yield
    module.fuse_lora(lora_scale=FUSED_SCALE, adapter_names=[ADAPTER])
    yield


@flow(LOAD, Call("model.unload_lora(): the plain model back", CHANGES), needs=("peft",),
      needs_api=("load_lora_adapter", "unload_lora"), refused=(LOADED_AFTER_TP,),
      equals=Equivalent("the plain model"))
def lora_unload(module, setting):
    _load(module, setting)
    yield
    module.unload_lora()
    yield


@flow(Call("model.enable_lora_hotswap(target_rank=4)"), LOAD,
      Call("model.load_lora_adapter(<another seeded LoRA of the same projections>, adapter_name='harness', "
           "hotswap=True)", CHANGES),
      **{**LORA, "needs_api": ("load_lora_adapter", "enable_lora_hotswap")},
      equals=Equivalent("the second LoRA loaded directly", lambda module, setting: _load(module, setting, SEED + 1)))
def lora_hotswap(module, setting):
    module.enable_lora_hotswap(target_rank=2 * RANK)
    yield
    _load(module, setting)
    yield
    _load(module, setting, seed=SEED + 1, hotswap=True)
    yield


@flow(Call("model.add_adapter(LoraConfig(r=2, target_modules=[to_q, to_k, to_v, to_out.0], "
           "init_lora_weights=False)): PEFT's way, as diffusers' training scripts add a LoRA", CHANGES),
      needs=("peft",), needs_api=("add_adapter",), refused=(LOADED_BEFORE_TP,),
      kinds=("tensor", "train"))  # train: only the adapter trains
def add_adapter(module, setting):
    import torch
    from peft import LoraConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)  # PEFT draws the adapter's weights from the global generator: the same everywhere
        module.add_adapter(LoraConfig(r=RANK, lora_alpha=RANK, target_modules=list(TARGETS),
                                      init_lora_weights=False), adapter_name=ADAPTER)
