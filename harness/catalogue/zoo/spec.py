"""What the harness knows about one model class: a tiny config and pipeline-like inputs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Inputs = dict[str, Any]
CpPlan = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    """Sequence geometry of one input set, so a spec can be run at lengths that do and do not split evenly.

    Image tokens form a `height` x `width` grid per frame (counted after patching), `frames` of them for video
    models; `text` tokens, the last `masked` of which are padding hidden by the text mask. `options` names
    model-specific pipeline variants (e.g. "isolate_modalities"); a tuple keeps the shape frozen and hashable.
    """

    name: str = "default"
    height: int = 4
    width: int = 4
    text: int = 8
    frames: int = 1
    masked: int = 0
    options: tuple[str, ...] = ()

    @property
    def grid_tokens(self) -> int:
        """Image tokens of one frame."""
        return self.height * self.width

    @property
    def image_tokens(self) -> int:
        """Image tokens of all frames: what a context-parallel layout splits for an image or video stream."""
        return self.frames * self.height * self.width

    def has(self, option: str) -> bool:
        return option in self.options


def shapes(*items: Shape) -> dict[str, Shape]:
    """A spec's shapes keyed by name, so the key and `Shape.name` cannot disagree."""
    return {item.name: item for item in items}


@dataclass(frozen=True)
class ModelSpec:
    """A diffusers transformer class at toy size; `make_inputs` builds what its pipeline would pass.

    `cp_plan`, when set, maps the model config to the context-parallel plan to pass to `enable_parallelism`
    instead of the class's `_cp_plan` (Helios names all 40 production blocks, more than a tiny config has).
    """

    name: str
    class_name: str
    config: dict[str, Any]
    make_inputs: Callable[[torch.Generator, Shape], Inputs]
    shapes: dict[str, Shape] = field(default_factory=lambda: {"default": Shape()})
    seed: int = 0
    cp_plan: Callable[[dict[str, Any]], CpPlan] | None = None
    # What context parallelism shards, per shape: {"image tokens": 16, "text tokens": 8}. Plain ring and Ulysses
    # need each length divisible by the degree; the default is the image stream and the text stream.
    split_lengths_of: Callable[[Shape], dict[str, int]] | None = None
    # Adapts the installed diffusers class where an older release needs it (harness.core.compat), e.g. QwenImage on 0.36
    # requires `txt_seq_lens`, which references captured on newer releases do not carry; None: the class as is.
    compat_class: Callable[[type], type] | None = None
    # Training (the `train` kind): the pipeline passes `timestep = sigma * timestep_scale` (1 for the Flux and Qwen
    # families, 1000 for Wan and LTX) under each of `timestep_keys`; `untrainable` says why the flow-matching recipe
    # does not apply to this model as the zoo builds it (None: it does).
    timestep_scale: float = 1.0
    timestep_keys: tuple[str, ...] = ("timestep",)
    untrainable: str | None = None
    # The cache contexts its pipeline opens around the transformer at each denoising step, in order (what a cache
    # flow's loop runs, harness.flows.denoising): true classifier-free guidance, `cond` then `uncond` with the
    # negative prompt, as the Flux (true_cfg_scale > 1), QwenImage and Wan pipelines call them; one branch where the
    # pipeline runs one call a step (guidance-distilled, or both branches batched in one context)
    cache_contexts: tuple[str, ...] = ("cond", "uncond")
    # PyTorch's context parallelism (the `tcpN` layouts, docs/torch_cp.md): the inputs `context_parallel` shards in
    # place as buffers, {input name: its sequence dim}, and the output's sequence dim to unshard; None: the model
    # cannot be run that way, and `torch_cp_unfit` says why (a plan-time SKIP).
    torch_cp_buffers: dict[str, int] | None = None
    torch_cp_output_dim: int = 1
    torch_cp_unfit: str = "no sequence buffers declared for PyTorch's context parallelism"

    def split_lengths(self, shape: str = "default") -> dict[str, int]:
        """The sequence lengths a context-parallel layout splits for `shape` (what must divide by the degree)."""
        geometry = self.shapes[shape]
        if self.split_lengths_of is not None:
            return self.split_lengths_of(geometry)
        return {"image tokens": geometry.image_tokens, "text tokens": geometry.text}

    def model_class(self):
        import diffusers

        from harness.core import compat

        compat.check_supported()
        cls = getattr(diffusers, self.class_name)
        return self.compat_class(cls) if self.compat_class is not None else cls

    def build(self) -> torch.nn.Module:
        """The model with seeded random weights (capture only: runs load the reference's weights instead)."""
        torch.manual_seed(self.seed)
        return self.model_class()(**self.config).eval()

    def inputs(self, shape: str = "default") -> Inputs:
        generator = torch.Generator().manual_seed(self.seed + 1)
        return self.make_inputs(generator, self.shapes[shape])

    def context_parallel_plan(self, config: dict[str, Any] | None = None) -> CpPlan | None:
        """The `cp_plan` for `enable_parallelism(config=..., cp_plan=...)`; None means the class's own `_cp_plan`."""
        if self.cp_plan is None:
            return None
        return self.cp_plan(dict(self.config if config is None else config))

    def config_hash(self) -> str:
        """Identifies config and shapes, so a stale reference is detected when the spec changes."""
        payload = json.dumps(
            {"class": self.class_name, "config": self.config, "shapes": {k: vars(v) for k, v in self.shapes.items()}},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def image_stream_only(shape: Shape) -> dict[str, int]:
    """For models whose `_cp_plan` splits the image/video stream and leaves the text stream whole (Wan's family)."""
    return {"image tokens": shape.image_tokens}


def randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator)


def timestep(generator: torch.Generator) -> torch.Tensor:
    """One denoising step in (0, 1], drawn from the seed so each spec sees a different one."""
    return randn(generator, 1).abs().clamp(min=0.05, max=1.0)


def image_grid_ids(height: int, width: int, extra_axes: int = 0, lead: int = 0) -> torch.Tensor:
    """Position ids (lead, row, col[, 0...]) for a latent grid, as the Flux pipelines build them."""
    rows = torch.arange(height).repeat_interleave(width)
    cols = torch.arange(width).repeat(height)
    columns = [torch.full_like(rows, lead), rows, cols] + [torch.zeros_like(rows)] * extra_axes
    return torch.stack(columns, dim=-1).float()


def text_mask(shape: Shape) -> torch.Tensor:
    """(1, text) 0/1 mask whose last `shape.masked` tokens are padding, as a right-padding tokenizer makes it."""
    mask = torch.ones(1, shape.text, dtype=torch.long)
    if shape.masked:
        mask[:, shape.text - shape.masked:] = 0
    return mask


def padded_text(generator: torch.Generator, shape: Shape, dim: int, scale: float = 30.0) -> torch.Tensor:
    """Text embeddings whose padding rows are large random values, so a layout that ignores the mask is far off.

    Real encoders emit finite garbage at padded positions; making it large turns "mask dropped" into a big error
    instead of one hidden under the tolerance.
    """
    embeds = randn(generator, 1, shape.text, dim)
    if shape.masked:
        embeds[:, shape.text - shape.masked:] = scale * randn(generator, 1, shape.masked, dim)
    return embeds
