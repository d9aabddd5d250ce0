"""A case's model loaded its load's way (harness.loads), and what proves the load read the right weights.

`enable` builds the class from the reference's config and weights; the checkpoint loads call
`<Class>.from_pretrained(folder, parallel_config=..., torch_dtype=...)` on the folder the run saved once
(harness.run.checkpoints, through `save_model` / `save_pipeline` here), exactly as diffusers' distributed-inference
guide writes it, and the image kind assembles `DiffusionPipeline.from_pretrained(folder, transformer=transformer)`
around it. The `tp_*` combinations build what a user would put together with tensor parallelism (a device_map, a
quantizer, group offloading, accelerate's offload hooks, a LoRA adapter); diffusers is the one to refuse them.

The engine makes the case's `LoadPlan` (`plan_for`) and hands it to the kind's `build`, which passes it on to
`transformer` (or `pipeline`) for its model: a reader follows a load from the case to the call. The single-device
baselines and the enable twin build with `enabled()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.loads import ENABLE, Load, load_of

# Small enough that a tiny model spreads over many files (tiny flux: 26) and a tensor-parallel shard of one weight
# lies in another file than the next weight's: the sharded loader must open the index's files, not one.
MAX_SHARD_SIZE = "20KB"


@dataclass(frozen=True)
class LoadPlan:
    """How a case's model loads: its load, the checkpoint folder, and the config `from_pretrained` is given
    (None: loaded plainly, the layout's parallelism applied after, or none)."""

    load: Load
    folder: Path | None = None
    config: object | None = None


def enabled() -> LoadPlan:
    """The `enable` way: the model built from the reference, its parallelism applied after (the single-device
    baselines, a checkpoint load's enable twin)."""
    return LoadPlan(load_of(ENABLE))


def folder(root: Path, model: str, shape: str, kind: str) -> Path:
    """Where the run keeps the checkpoint of a reference (one folder per reference file)."""
    return Path(root) / model / (kind if shape == "default" else f"{kind}@{shape}")


def parallel_config(load: Load, layout, mesh):
    """What `from_pretrained` is given for `layout`: the layout's own config (a ContextParallelConfig, a
    TensorParallelConfig, or a ParallelConfig holding both), inside a ParallelConfig for `pretrained_wrapped`; None
    for a layout diffusers has no config for (one device, data parallel, PyTorch's context parallelism)."""
    config = layout.diffusers_config(mesh)
    if config is None or not load.wrapped:
        return config
    import diffusers

    if isinstance(config, diffusers.ParallelConfig):
        return config
    key = "tensor_parallel_config" if isinstance(config, getattr(diffusers, "TensorParallelConfig", ())) else \
        "context_parallel_config"
    return diffusers.ParallelConfig(**{key: config})


def describe(plan: LoadPlan, class_name: str, layout) -> dict:
    """The call as the report shows it, and what it says when diffusers is given no config."""
    config = "" if plan.config is None else f", parallel_config={_spelled(plan.config)}"
    extra = "".join(f", {key}={value!r}" for key, value in plan.load.from_pretrained().items())
    call = f"{class_name}.from_pretrained(<checkpoint>{config}{extra}, torch_dtype=...)"
    note = None
    if plan.config is None and layout.world_size > 1:
        note = (f"loaded plainly: diffusers takes no parallel_config for {layout.name} (the harness applies "
                f"{'PyTorch context parallelism' if layout.is_torch_context_parallel else 'its data-parallel engine'}"
                " after the load)")
    return {"call": call, "note": note}


def _spelled(config) -> str:
    import diffusers

    if isinstance(config, diffusers.ParallelConfig):
        parts = [f"{key}={_spelled(value)}" for key in ("context_parallel_config", "tensor_parallel_config")
                 if (value := getattr(config, key, None)) is not None]
        return f"ParallelConfig({', '.join(parts)})"
    fields = {"ring_degree": 1, "ulysses_degree": 1, "tp_degree": 1, "ulysses_anything": False, "ring_anything": False}
    given = [f"{key}={getattr(config, key)}" for key, default in fields.items()
             if getattr(config, key, default) not in (default, None)]
    return f"{type(config).__name__}({', '.join(given)})"


def transformer(plan: LoadPlan, model_class, reference, device, dtype,
                subfolder: str | None = None) -> torch.nn.Module:
    """The case's transformer on `device`, loaded `plan`'s way: from the reference and prepared in memory as its load
    says (`enable`, the in-memory combinations), or from the checkpoint folder through `from_pretrained` with its
    load's options and the plan's config (the checkpoint loads). `subfolder`: the transformer's folder inside a
    pipeline folder."""
    if not plan.load.checkpoint:
        model = model_class(**reference.meta["config"])
        model.load_state_dict(reference.weights)
        model = model.to(device, dtype)
        plan.load.prepare(model, device)
        return model
    options = {"torch_dtype": dtype, **plan.load.from_pretrained(), **({"subfolder": subfolder} if subfolder else {})}
    if plan.config is not None:
        options["parallel_config"] = plan.config
    with _no_progress_bars():
        return model_class.from_pretrained(str(plan.folder), **options).to(device)


def pipeline(plan: LoadPlan, build_enabled, load_transformer, device, dtype):
    """The case's pipeline, loaded `plan`'s way: `build_enabled()` with its transformer prepared in memory as its load
    says, else the pipeline folder's components with the parallel transformer passed in, as the guide assembles it
    (`DiffusionPipeline.from_pretrained(folder, transformer=transformer)`); `load_transformer()` loads the
    transformer its load's way (`transformer` with its subfolder)."""
    if not plan.load.checkpoint:
        pipe = build_enabled()
        plan.load.prepare(pipe.transformer, device)
        return pipe
    from diffusers import DiffusionPipeline

    transformer_module = load_transformer()
    index = json.loads((plan.folder / "model_index.json").read_text())
    absent = {name: None for name, value in index.items() if isinstance(value, list) and value[0] is None}
    with _no_progress_bars():  # the tiny pipelines save no text encoder: passed as None
        pipe = DiffusionPipeline.from_pretrained(str(plan.folder), transformer=transformer_module, torch_dtype=dtype,
                                                 **absent)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


@contextlib.contextmanager
def _no_progress_bars():
    """diffusers' "Loading checkpoint shards" bars, one per rank and load, would fill the launch's log."""
    from diffusers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def save_model(reference, model_class, target: Path) -> None:
    """The reference's weights as a diffusers checkpoint folder: config.json, sharded safetensors and their index."""
    model = model_class(**reference.meta["config"])
    model.load_state_dict(reference.weights)
    model.save_pretrained(str(target), safe_serialization=True, max_shard_size=MAX_SHARD_SIZE)


def save_pipeline(pipe, target: Path) -> None:
    """A whole pipeline folder (model_index.json, each component's subfolder), its weights sharded alike. diffusers'
    word on each absent text encoder ("cannot be saved") is true and no news: the run's log stays clean."""
    from diffusers.utils import logging as diffusers_logging

    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        pipe.save_pretrained(str(target), safe_serialization=True, max_shard_size=MAX_SHARD_SIZE)
    finally:
        diffusers_logging.set_verbosity(verbosity)


def shard_digests(module: torch.nn.Module) -> dict[str, str]:
    """Each parameter's local tensor on this rank (a DTensor's own shard), digested with its shape and dtype: what
    two loads of one layout must agree on bit for bit."""
    found = {}
    for name, parameter in module.named_parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        data = local.detach().cpu().contiguous()
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
        found[name] = f"{tuple(data.shape)} {str(data.dtype).removeprefix('torch.')} {digest.hexdigest()[:16]}"
    return found


def differing(loaded: dict[str, str], enabled: dict[str, str]) -> list[str]:
    """The parameters whose local shard differs between the two loads (one missing from either counts)."""
    return sorted(name for name in loaded.keys() | enabled.keys() if loaded.get(name) != enabled.get(name))


def plan_for(case, checkpoints: Path | None, mesh) -> LoadPlan:
    """The case's load plan: its folder and config for a checkpoint load; the load alone for one in memory."""
    load = load_of(case.load)
    if not load.checkpoint:
        return LoadPlan(load)
    if checkpoints is None:
        raise RuntimeError(f"case {case.case_id}: the {load.name} load needs the run's checkpoint folder, and this "
                           f"launch was given none")
    return LoadPlan(load, folder(checkpoints, case.model, case.shape, case.kind),
                    parallel_config(load, case.layout, mesh))
