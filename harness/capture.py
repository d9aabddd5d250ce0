"""Capture fp32 single-device references: the weights, the inputs and the output, in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from harness import determinism, environment
from harness.reference import reference_path, write_reference
from harness.zoo import ModelSpec


def run_model(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def capture_one(spec: ModelSpec, shape: str, root: Path, force: bool = False) -> tuple[Path, bool]:
    """Returns the path and whether it was written (False: kept an existing reference)."""
    path = reference_path(root, spec.name, shape)
    if path.exists() and not force:
        return path, False
    determinism.strict_fp32()
    model = spec.build().to(torch.float32)
    inputs = spec.inputs(shape)
    output = run_model(model, inputs)
    meta = {
        "model": spec.name,
        "class": spec.class_name,
        "shape": shape,
        "kind": "tensor",
        "dtype": "fp32",
        "layout": "single",
        "backend": "native",
        "world_size": 1,
        "seed": spec.seed,
        "config": spec.config,
        "config_hash": spec.config_hash(),
        **environment.describe(),
    }
    written = write_reference(path, model.state_dict(), inputs, output, meta, force=force)
    return path, written


def capture(specs_and_shapes, root: Path, force: bool = False, echo: Callable[[str], None] = print) -> list[Path]:
    determinism.quiet_diffusers()
    paths = []
    for spec, shape in specs_and_shapes:
        path, written = capture_one(spec, shape, root, force)
        echo(f"{'captured' if written else 'kept    '} {path}")
        paths.append(path)
    return paths
