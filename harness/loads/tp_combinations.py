"""The combinations diffusers guards tensor parallelism against (harness.loads.guard), each built the way a user
would put it together: refused with diffusers' own error where the installed release guards it, judged on its numbers
where it does not. Each exists on tensor-parallel layouts only."""

from __future__ import annotations

from harness.loads.guard import Guard
from harness.loads.registry import checkpoint_load, memory_load


@checkpoint_load("from_pretrained(folder, parallel_config=<TP>, device_map='cpu'|'cuda')",
                 guard=Guard("a device_map", "`device_map` cannot be combined with a tensor-parallel"))
def tp_device_map() -> dict:
    import torch

    return {"device_map": "cuda" if torch.cuda.is_available() else "cpu"}


@checkpoint_load("from_pretrained(folder, parallel_config=<TP>, quantization_config=<a CPU quantizer>)",
                 guard=Guard("a quantization_config", "`quantization_config` cannot be combined with a "
                             "tensor-parallel", ("optimum.quanto",), "a quantizer that runs on CPU (optimum-quanto): "
                             "diffusers validates the quantizer's environment before its tensor-parallel check"))
def tp_quantized() -> dict:
    from diffusers import QuantoConfig

    return {"quantization_config": QuantoConfig(weights_dtype="int8")}


@memory_load("the model group-offloaded (enable_group_offload), then enable_parallelism(<TP>)",
             guard=Guard("group offloading", "has group offloading enabled, which cannot be combined with tensor"))
def tp_group_offload(model, device) -> None:
    model.enable_group_offload(onload_device=device, offload_type="block_level", num_blocks_per_group=1)


@memory_load("the model placed by accelerate's cpu_offload, then enable_parallelism(<TP>)",
             guard=Guard("accelerate's CPU offloading", "is placed by accelerate", ("accelerate",), "accelerate"))
def tp_cpu_offload(model, device) -> None:
    from accelerate import cpu_offload

    cpu_offload(model, execution_device=device)


@memory_load("a LoRA adapter added (add_adapter), then enable_parallelism(<TP>)",
             guard=Guard("LoRA adapter layers", "has adapter (LoRA) layers injected", ("peft",),
                         "peft (diffusers' LoRA layers)"))
def tp_lora(model, device) -> None:
    from peft import LoraConfig

    model.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False))
