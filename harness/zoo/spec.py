"""What the harness knows about one model class: a tiny config and pipeline-like inputs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

Inputs = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    """Sequence geometry of one input set: image tokens as a (height, width) grid and text tokens."""

    name: str = "default"
    height: int = 4
    width: int = 4
    text: int = 8

    @property
    def image_tokens(self) -> int:
        return self.height * self.width


@dataclass(frozen=True)
class ModelSpec:
    """A diffusers transformer class at toy size; `make_inputs` builds what its pipeline would pass."""

    name: str
    class_name: str
    config: dict[str, Any]
    make_inputs: Callable[[torch.Generator, Shape], Inputs]
    shapes: dict[str, Shape] = field(default_factory=lambda: {"default": Shape()})
    seed: int = 0

    def model_class(self):
        import diffusers

        return getattr(diffusers, self.class_name)

    def build(self) -> torch.nn.Module:
        """The model with seeded random weights (capture only: runs load the reference's weights instead)."""
        torch.manual_seed(self.seed)
        return self.model_class()(**self.config).eval()

    def inputs(self, shape: str = "default") -> Inputs:
        generator = torch.Generator().manual_seed(self.seed + 1)
        return self.make_inputs(generator, self.shapes[shape])

    def config_hash(self) -> str:
        """Identifies config and shapes, so a stale reference is detected when the spec changes."""
        payload = json.dumps(
            {"class": self.class_name, "config": self.config, "shapes": {k: vars(v) for k, v in self.shapes.items()}},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator)


def image_grid_ids(height: int, width: int, extra_axes: int = 0, lead: int = 0) -> torch.Tensor:
    """Position ids (lead, row, col[, 0...]) for a latent grid, as the Flux pipelines build them."""
    rows = torch.arange(height).repeat_interleave(width)
    cols = torch.arange(width).repeat(height)
    columns = [torch.full_like(rows, lead), rows, cols] + [torch.zeros_like(rows)] * extra_axes
    return torch.stack(columns, dim=-1).float()
