"""Flows on memory: layerwise casting (weights stored in bf16, computed in the case's dtype), group offloading and a
pipeline's model CPU offload, each as diffusers' memory guide writes it."""

from __future__ import annotations

from harness.flows.registry import AFTER, BEFORE, CHANGES, KEEPS, Call, Refused, flow

TP_MODULE = "diffusers.hooks.tensor_parallel"


@flow(Call("model.enable_layerwise_casting(storage_dtype=torch.bfloat16, compute_dtype=<the case's dtype>)",
           CHANGES), needs_api=("enable_layerwise_casting",), quick_compiled=True)
def layerwise_casting(module, setting):
    import torch

    module.enable_layerwise_casting(storage_dtype=torch.bfloat16, compute_dtype=setting.dtype)


@flow(Call("model.enable_group_offload(onload_device=<the rank's device>, offload_type='block_level', "
           "num_blocks_per_group=1)", KEEPS), needs_api=("enable_group_offload",),
      refused=(Refused(BEFORE, "tp", "has group offloading enabled, which cannot be combined with tensor", TP_MODULE,
                       "_check_tp_supported, from enable_parallelism"),
               Refused(AFTER, "tp", "be group-offloaded", "diffusers.models.modeling_utils",
                       "_raise_if_tensor_parallel, from enable_group_offload")))
def group_offload(module, setting):
    module.enable_group_offload(onload_device=setting.device, offload_type="block_level", num_blocks_per_group=1)


@flow(Call("pipe.enable_model_cpu_offload(device=<the rank's device>): the pipeline's models kept on the CPU, each "
           "moved to the accelerator while it runs", KEEPS), kinds=("image",), needs=("accelerate",),
      needs_accelerator=True,
      refused=(Refused(BEFORE, "tp", "is placed by accelerate", TP_MODULE,
                       "_check_tp_supported, from enable_parallelism"),
               Refused(AFTER, "tp", "be CPU-offloaded (model or sequential)", "diffusers.pipelines.pipeline_utils",
                       "_maybe_raise_error_if_tensor_parallel_active, from enable_model_cpu_offload")))
def cpu_offload(module, setting):
    setting.pipeline.enable_model_cpu_offload(device=setting.device)
