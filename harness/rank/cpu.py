"""The CPU/gloo shims diffusers (and PyTorch's context parallelism) need to run parallel code without an accelerator,
one for what compiling costs there (Inductor's CPU kernels scalar: they stand in for a GPU's), and one for gloo
itself (each group runs one collective at a time: two at once corrupted a rank's heap).

Active only when CUDA is absent; each shim leaves what diffusers accepts or refuses unchanged, and applies only
where the installed diffusers has the feature it adapts (harness.core.compat): a release without TP needs no TP shim.
"""

from __future__ import annotations

import functools
import os

import torch

from harness.core import compat

_applied = False
# The functions of diffusers the shims stand in for on CPU (their own bodies then never run here: coverage says so).
NATIVE_FLASH_OPS = ("_native_flash_attention_forward_op", "_native_flash_attention_backward_op")


def needed() -> bool:
    return not torch.cuda.is_available()


def apply() -> None:
    """Install every shim once per process; a no-op on CUDA machines."""
    global _applied
    if _applied or not needed():
        return
    _device_count_at_least_one()
    _rank_device_is_cpu()
    if compat.has("tensor_parallel"):
        _allow_tensor_parallel_on_cpu()
    if compat.has("native_flash_ops"):  # before 0.37 `_native_flash` has no ring path, so nothing to adapt
        _native_flash_ops_on_cpu()
    _torch_ring_serves_cpu_sdpa()
    _inductor_kernels_scalar()
    _gloo_one_worker_thread()
    _applied = True


def _device_count_at_least_one() -> None:
    # diffusers places rank r on device `r % torch.accelerator.device_count()`, which is 0 on CPU.
    original = torch.accelerator.device_count
    torch.accelerator.device_count = functools.wraps(original)(lambda: max(1, original()))


def _rank_device_is_cpu() -> None:
    # With the count above, diffusers names each rank's device `cpu:<rank % 1>` = `cpu:0`, an index a CPU tensor never
    # has: torch then treats it as another device and copies, so an `nn.Parameter` moved there comes back a plain
    # tensor without requires_grad (accelerate's set_module_tensor_to_device does that to every parameter outside the
    # `_tp_plan` in from_pretrained's tensor-parallel load: frozen in training). A CUDA rank's device is the device its
    # tensors are on, where that move is no copy; on CPU that device is `cpu`.
    from diffusers.models import _modeling_parallel as parallel

    for config in (parallel.ParallelConfig, parallel.ContextParallelConfig,
                   getattr(parallel, "TensorParallelConfig", None)):
        if config is None or getattr(config.setup, "_harness_cpu_shim", False):
            continue
        config.setup = _cpu_device_setup(config.setup)


def _cpu_device_setup(original):
    @functools.wraps(original)
    def setup(self, rank, world_size, device, *args, **kwargs):
        if isinstance(device, torch.device) and device.type == "cpu":
            device = torch.device("cpu")
        return original(self, rank, world_size, device, *args, **kwargs)

    setup._harness_cpu_shim = True
    return setup


def _allow_tensor_parallel_on_cpu() -> None:
    # diffusers' TP refuses device types outside `_SUPPORTED_TP_DEVICES`; DTensor itself runs on CPU with gloo.
    from diffusers.hooks import tensor_parallel

    if "cpu" not in tensor_parallel._SUPPORTED_TP_DEVICES:
        tensor_parallel._SUPPORTED_TP_DEVICES = (*tensor_parallel._SUPPORTED_TP_DEVICES, "cpu")


def _native_flash_ops_on_cpu() -> None:
    # Ring attention needs the LSE; `_native_flash` gets it from a CUDA-only aten op, so route CPU tensors to
    # `_scaled_dot_product_flash_attention_for_cpu`, which returns it too. diffusers' ring and merge code is unchanged.
    from diffusers.models import attention_dispatch as dispatch

    forward, backward = (getattr(dispatch, name) for name in NATIVE_FLASH_OPS)
    if getattr(forward, "_harness_cpu_shim", False):
        return
    setattr(dispatch, NATIVE_FLASH_OPS[0], _cpu_flash_forward(forward))
    setattr(dispatch, NATIVE_FLASH_OPS[1], _cpu_flash_backward(backward))


def replaced() -> dict[tuple[str, str], str]:
    """(module, function) of diffusers that the shims stand in for on this machine, and why."""
    if not needed() or not compat.has("native_flash_ops"):
        return {}
    why = ("its aten op (_scaled_dot_product_flash_attention) has no CPU kernel: on this machine the harness's CPU "
           "shim stands in for it (harness/rank/cpu.py)")
    return {("diffusers.models.attention_dispatch", name): why for name in NATIVE_FLASH_OPS}


def _cpu_flash_forward(original):
    @functools.wraps(original)
    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        if query.device.type != "cpu":
            return original(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                            _save_ctx=_save_ctx, _parallel_config=_parallel_config)
        if enable_gqa:
            raise ValueError("`enable_gqa` is not yet supported for native flash attention.")
        q, k, v = (x.transpose(1, 2).contiguous() for x in (query, key, value))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        out, lse = out.transpose(1, 2).contiguous(), lse.transpose(1, 2).contiguous()
        if _save_ctx:
            ctx.save_for_backward(query, key, value, out, lse)
            ctx.dropout_p, ctx.is_causal, ctx.scale = dropout_p, is_causal, scale
        return (out, lse) if return_lse else out

    forward_op._harness_cpu_shim = True
    return forward_op


def _cpu_flash_backward(original):
    @functools.wraps(original)
    def backward_op(ctx, grad_out, *args, query=None, key=None, value=None, out=None, lse=None, **kwargs):
        saved = ctx.saved_tensors
        if saved[0].device.type != "cpu":
            return original(ctx, grad_out, *args, query=query, key=key, value=value, out=out, lse=lse, **kwargs)
        given = (query, key, value, out, lse)
        tensors = [saved[i] if given[i] is None else given[i] for i in range(5)]
        grad_out, *tensors = (x.transpose(1, 2).contiguous() for x in (grad_out, *tensors))
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, *tensors, ctx.dropout_p, ctx.is_causal, scale=ctx.scale
        )
        return tuple(g.transpose(1, 2).contiguous() for g in grads)

    return backward_op


def _torch_ring_serves_cpu_sdpa() -> None:
    # PyTorch's CP ring (`context_parallel`) handles only the CUDA SDPA ops; on CPU, SDPA dispatches
    # `_scaled_dot_product_flash_attention_for_cpu`, which DTensor would serve by all-gathering K and V and running one
    # whole attention (no ring at all). Register that op and its backward in PyTorch's own handler table, served by
    # PyTorch's own templated ring and its backward, so the ring algorithm is what runs.
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as ring
    except ImportError:  # a torch without context parallelism: the tcp layouts fail where they start, loudly
        return
    aten = torch.ops.aten
    forward, backward = aten._scaled_dot_product_flash_attention_for_cpu.default, \
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def handler(op, args, kwargs):
        from torch.distributed.tensor import DTensor, Shard

        bound = {**dict(zip((a.name for a in op._schema.arguments), args, strict=False)), **kwargs}
        mesh = bound["query"].device_mesh
        local = {k: v._local_tensor if isinstance(v, DTensor) else v for k, v in bound.items()}
        if local.pop("attn_mask", None) is not None:
            raise NotImplementedError("PyTorch's context-parallel ring takes no attention mask")
        if op is forward:
            results = ring._templated_ring_attention(mesh.get_group(), 2, forward, **local)
        else:
            results = ring._templated_ring_attention_backward(mesh.get_group(), 2, backward, grad_out_name="grad_out",
                                                              **local)
        return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in results)

    ring.custom_ops[forward] = ring.custom_ops[backward] = handler


def _inductor_kernels_scalar() -> None:
    # On CPU, Inductor's C++ kernels stand in for the Triton kernels a GPU run generates. What a compiled case checks
    # (the graphs Dynamo makes of diffusers' parallel code, their collectives and breaks, the numbers against eager)
    # is the same with scalar loops, while vectorized ones cost a quarter of a cold compile's CPU: ATen's at::vec
    # templates in every g++ call and the probe of the CPU's vector instructions (docs/compile.md). The fusions stay
    # Inductor's. A TORCHINDUCTOR_VEC_ISA_OK the user set is kept (1: Inductor's vectorized CPU code, as it ships).
    if "TORCHINDUCTOR_VEC_ISA_OK" in os.environ:
        return
    from torch._inductor import config, cpu_vec_isa

    config.cpp.vec_isa_ok = False
    cpu_vec_isa.valid_vec_isa_list.cache_clear()  # a list probed before this, with the vector ISAs, is not kept


def _gloo_one_worker_thread() -> None:
    # gloo runs each group's collectives on two worker threads, so two issued with no wait between them (functional
    # collectives, DTensor's, FSDP's and DDP's asynchronous ones) run at once; a rank's heap was corrupted that way
    # (a gloo worker thread's free found its block overwritten: benchmarks/gloo_concurrency.py, docs/findings.md).
    # With one worker thread the group runs them one after the other, in the order issued, as NCCL's stream does.
    from torch.distributed import distributed_c10d as c10d

    gloo = c10d.ProcessGroupGloo
    if getattr(gloo, "_harness_cpu_shim", False):
        return

    class OneWorkerThread(gloo):
        _harness_cpu_shim = True

        def __init__(self, store, rank, size, timeout=None):
            options = gloo._Options()
            options._devices = [gloo.create_default_device()]
            options._threads = 1
            if timeout is not None:
                options._timeout = timeout
            super().__init__(store, rank, size, options)

    c10d.ProcessGroupGloo = OneWorkerThread
