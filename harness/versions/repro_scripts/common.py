"""The part of every `harness repro` script that is not the kind's: the reference, the model, the layout, the CPU
shims. `harness.versions.repro` copies everything below the marker into the script, after the case's CASE dict; the
script imports torch, diffusers and safetensors only, never the harness. Kept as real Python so it is linted and
tested as such."""

CASE: dict = {}  # the generated script defines the case first
# --- script ---
import argparse  # noqa: E402 - the generated script's imports follow its CASE dict
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

# diffusers' "experimental feature" notices and deprecation warnings say nothing about the case
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*experimental.*")

import diffusers  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def start():
    """(rank, world size, device); one process group over torchrun's ranks (gloo on CPU, NCCL on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world != CASE["world_size"]:
        sys.exit(f"{CASE['id']} runs on {CASE['world_size']} rank(s): torchrun --standalone "
                 f"--nproc-per-node={CASE['world_size']} {sys.argv[0]}")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 must be fp32 (TF32 rounds matmuls to 10 bits)
    torch.backends.cudnn.allow_tf32 = False
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # as the harness runs every rank: another count changes fp32 sums by ~1e-7
        cpu_shims()
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return (dist.get_rank() if world > 1 else 0), world, device


def finish(world):
    """The rank's end once its verdict is out. Not Python's own teardown: a gloo group's worker thread can still be
    freeing a finished collective as the interpreter finalizes; when that work holds a Python object (torch 2.13
    stashes one for each backward), its thread takes the GIL to drop it and the rank aborts ("terminate called
    without an active exception") after printing its verdict. docs/reliability.md has the stack."""
    if world > 1:
        dist.destroy_process_group()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)


def cpu_shims():
    """Only what diffusers needs to run its own parallel code on CPU with gloo (the harness's harness/rank/cpu.py):
    its rank-to-device arithmetic divides by the accelerator count (0 on CPU); its tensor parallelism refuses the
    device type cpu; ring attention needs the log-sum-exp, which `_native_flash` gets from a CUDA-only op, so its
    forward/backward ops get a CPU path through aten's CPU flash kernel. diffusers' ring and merge code is unchanged."""
    count = torch.accelerator.device_count
    torch.accelerator.device_count = functools.wraps(count)(lambda: max(1, count()))
    with contextlib.suppress(ImportError):
        from diffusers.hooks import tensor_parallel

        if "cpu" not in tensor_parallel._SUPPORTED_TP_DEVICES:
            tensor_parallel._SUPPORTED_TP_DEVICES = (*tensor_parallel._SUPPORTED_TP_DEVICES, "cpu")
    from diffusers.models import attention_dispatch as dispatch

    if hasattr(dispatch, "_native_flash_attention_forward_op"):
        dispatch._native_flash_attention_forward_op = _cpu_flash_forward(dispatch._native_flash_attention_forward_op)
        dispatch._native_flash_attention_backward_op = _cpu_flash_backward(
            dispatch._native_flash_attention_backward_op)


def _cpu_flash_forward(original):
    @functools.wraps(original)
    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        if enable_gqa:
            raise ValueError("`enable_gqa` is not yet supported for native flash attention.")
        q, k, v = (x.transpose(1, 2).contiguous() for x in (query, key, value))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        out, lse = out.transpose(1, 2).contiguous(), lse.transpose(1, 2).contiguous()
        if _save_ctx:
            ctx.save_for_backward(query, key, value, out, lse)
            ctx.dropout_p, ctx.is_causal, ctx.scale = dropout_p, is_causal, scale
        return (out, lse) if return_lse else out

    return forward_op


def _cpu_flash_backward(original):
    @functools.wraps(original)
    def backward_op(ctx, grad_out, *args, query=None, key=None, value=None, out=None, lse=None, **kwargs):
        given = (query, key, value, out, lse)
        tensors = [ctx.saved_tensors[i] if given[i] is None else given[i] for i in range(5)]
        grad_out, *tensors = (x.transpose(1, 2).contiguous() for x in (grad_out, *tensors))
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, *tensors, ctx.dropout_p, ctx.is_causal, scale=ctx.scale)
        return tuple(g.transpose(1, 2).contiguous() for g in grads)

    return backward_op


class Reference:
    """The harness's reference file: the seed weights, the inputs, the fp32 single-device output (`output`), what a
    kind keeps besides (`extras`: for training the noise, sigmas, step-1 gradients and final weights)."""

    def __init__(self, path):
        with safe_open(str(path), framework="pt") as handle:
            self.meta = json.loads(handle.metadata()["harness"])
        tensors = load_file(str(path))
        self.path = path
        self.weights = {k[len("weights."):]: v for k, v in tensors.items() if k.startswith("weights.")}
        self.inputs = {k[len("inputs."):]: v for k, v in tensors.items() if k.startswith("inputs.")}
        self.inputs.update({k: _decoded(v) for k, v in self.meta.get("static_inputs", {}).items()})
        self.extras = {k[len("extra."):]: v for k, v in tensors.items() if k.startswith("extra.")}
        self.output = tensors["output"]


def _decoded(value):
    if isinstance(value, dict) and set(value) == {"__tuple__"}:
        return tuple(_decoded(item) for item in value["__tuple__"])
    return [_decoded(item) for item in value] if isinstance(value, list) else value


def reference_path():
    """--reference PATH, else the reference file next to this script, else where it was when the script was
    written."""
    parser = argparse.ArgumentParser(description=f"Reproduce {CASE['id']} (written by harness repro).")
    parser.add_argument("--reference", default=None, help="the reference .safetensors file")
    given = parser.parse_args().reference
    beside = Path(__file__).resolve().parent / CASE["reference"]["name"]
    path = Path(given) if given else beside if beside.is_file() else Path(CASE["reference"]["path"])
    if not path.is_file():
        sys.exit(f"no reference at {path}: pass --reference PATH (the harness's {CASE['reference']['name']})")
    return path


FLOW = None  # a case with a flow: its part of the script, below, defines the flow's calls here
FLOW_INPUTS = None  # ...and what it passes with each call of the model, if anything: (model, device, dtype) -> kwargs


def flow_calls(model, position, device, dtype, backend, config=None, cp_plan=None):
    """The case's flow (the harness's harness/flows) if it comes at `position` ("before" or "after"
    enable_parallelism), or on one device (`position` None): with the same Setting the harness gives it."""
    flow = CASE.get("flow")
    if flow is not None and position in (None, flow["position"]):
        FLOW(model, device, backend, dtype, config, cp_plan)  # the fields of the harness's flows.Setting


def build_model(reference, dtype, device, backend=None):
    """The tiny model from the reference's config and seed weights, on the case's backend (or `backend`)."""
    model = getattr(diffusers, reference.meta["class"])(**reference.meta["config"])
    model.load_state_dict(reference.weights)
    model = model.to(device, dtype)
    model.set_attention_backend(backend or CASE["backend"])
    return model


def loaded_model(reference, dtype, device, parallel, backend=None):
    """The model of the case on one device, or under its layout: built and then `enable_parallelism` (the `enable`
    load), or, for a `pretrained` load, `from_pretrained(folder, parallel_config=..., torch_dtype=...)` on the
    reference's weights saved as a sharded diffusers checkpoint, as diffusers' distributed-inference guide loads it;
    the case's flow called around it."""
    load, backend = CASE.get("load") or {"checkpoint": False}, backend or CASE["backend"]
    if not (parallel and load["checkpoint"]):
        model = build_model(reference, dtype, device, backend)
        flow_calls(model, "before" if parallel else None, device, dtype, backend)
        if parallel:
            flow_calls(model, "after", device, dtype, backend, *parallelize(model, device))
        return model
    folder = Path(__file__).resolve().with_name(f"{Path(__file__).stem}-checkpoint")
    if not dist.is_initialized() or dist.get_rank() == 0:  # written once, by rank 0, the others wait
        if not (folder / "config.json").is_file():
            build_model(reference, torch.float32, "cpu").save_pretrained(
                str(folder), safe_serialization=True, max_shard_size=load["max_shard_size"])
    if dist.is_initialized():
        dist.barrier()
    config = parallel_config(make_mesh(device))
    if load["wrapped"] and not isinstance(config, diffusers.ParallelConfig):
        key = "tensor_parallel_config" if CASE["layout"]["ring"] * CASE["layout"]["ulysses"] == 1 else \
            "context_parallel_config"
        config = diffusers.ParallelConfig(**{key: config})
    print(f"  rank {dist.get_rank()}: {reference.meta['class']}.from_pretrained({folder.name}, parallel_config="
          f"{type(config).__name__}(...), torch_dtype={dtype})", flush=True)
    model = getattr(diffusers, reference.meta["class"]).from_pretrained(str(folder), parallel_config=config,
                                                                         torch_dtype=dtype).to(device)
    model.set_attention_backend(backend)
    flow_calls(model, "after", device, dtype, backend)  # nothing comes before from_pretrained's parallelism
    return model


def moved(value, device, dtype=None):
    """On the device (floating tensors in `dtype`), cloned: tensors mapped from a file can sit at unaligned
    addresses, which moves results by ~1e-7."""
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device, dtype if dtype is not None and value.is_floating_point() else value.dtype).clone()


def older_release_inputs(model, inputs):
    """What diffusers 0.36's QwenImagePipeline passes and later releases do not need: the text length as
    `txt_seq_lens` (0.36's RoPE requires it), and the mask (None) its context-parallel split hook requires. A no-op
    on 0.37 and later and for other models."""
    module = sys.modules[type(model).__module__]
    rope = getattr(getattr(module, "QwenEmbedRope", None), "forward", None)
    needed = rope is not None and inspect.signature(rope).parameters.get("txt_seq_lens")
    text = inputs.get("encoder_hidden_states")
    if needed is not None and needed is not False and needed.default is inspect.Parameter.empty \
            and text is not None and inputs.get("txt_seq_lens") is None:
        inputs["txt_seq_lens"] = [text.shape[1]] * text.shape[0]
    if "encoder_hidden_states_mask" in ((getattr(type(model), "_cp_plan", None) or {}).get("") or {}):
        inputs.setdefault("encoder_hidden_states_mask", None)
    return inputs


def make_mesh(device):
    layout = CASE["layout"]
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, tuple(layout["mesh_shape"]), mesh_dim_names=tuple(layout["mesh_names"]))


def parallel_config(mesh):
    """What `enable_parallelism` gets for the layout, as the harness builds it (harness/core/layouts.py): only the
    arguments this diffusers accepts (`mesh=` from 0.38 on; before, diffusers builds its own mesh)."""
    layout, cp, tp = CASE["layout"], None, None
    if layout["ring"] * layout["ulysses"] > 1:
        options = {"ring_degree": layout["ring"], "ulysses_degree": layout["ulysses"]}
        if layout["anything"] and layout["ulysses"] > 1:
            options["ulysses_anything"] = True
        if layout["anything"] and layout["ring"] > 1:
            options["ring_anything"] = True
        if "mesh" in {field.name for field in dataclasses.fields(diffusers.ContextParallelConfig)}:
            options["mesh"] = mesh["ring", "ulysses"] if layout["tp"] > 1 else mesh
        cp = diffusers.ContextParallelConfig(**options)
    if layout["tp"] > 1:
        tp = diffusers.TensorParallelConfig(tp_degree=layout["tp"], mesh=mesh["tp"] if cp is not None else mesh)
    if cp is not None and tp is not None:
        return diffusers.ParallelConfig(context_parallel_config=cp, tensor_parallel_config=tp)
    return cp or tp


def parallelize(model, device):
    """diffusers' own `enable_parallelism` with the layout's config (and the harness's plan where it passes one);
    both returned, for a flow called after it."""
    plan = None
    if CASE.get("cp_plan_blocks") is not None:  # the class's plan names more blocks than the tiny config builds
        blocks = CASE["cp_plan_blocks"]
        plan = {key: value for key, value in type(model)._cp_plan.items()
                if not (key.startswith("blocks.") and key.split(".")[1].isdigit() and int(key.split(".")[1]) >= blocks)}
    config = parallel_config(make_mesh(device))
    model.enable_parallelism(config=config, cp_plan=plan)
    return config, plan


def say(rank, text):
    if rank == 0:
        print(text, flush=True)


def describe(reference, world):
    made = reference.meta
    return (f"{CASE['id']}\n  reference: {reference.path} (diffusers {made.get('diffusers')}, torch "
            f"{made.get('torch')})\n  this run:  diffusers {diffusers.__version__}, torch {torch.__version__}, "
            f"{world} rank(s)")


def verdict(broken):
    return f"FAIL ({'; '.join(broken)})" if broken else "PASS"
