"""Capture fp32 single-device references: the weights, the inputs and the output, in one process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from harness import determinism, environment
from harness.errors import HarnessError
from harness.reference import read_meta, read_reference, reference_path, write_reference
from harness.zoo import ModelSpec, get_spec


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


def capture_all(models, root: Path, force: bool = False, kinds=("tensor", "image"), weights_dir=None,
                echo: Callable[[str], None] = print) -> None:
    """Tensor references for every shape of each model, and the image reference of each model with a pipeline."""
    from harness.image_runs import capture_image, has_pipeline

    specs = [get_spec(name) for name in models]
    if "tensor" in kinds:
        capture([(spec, shape) for spec in specs for shape in spec.shapes], root, force, echo)
    if "image" in kinds:
        for spec in specs:
            if has_pipeline(spec.name):
                path, written = capture_image(spec.name, root, force, weights_dir)
                echo(f"{'captured' if written else 'kept    '} {path}")


def ensure_references(keys: set[tuple[str, str, str]], root: Path, echo: Callable[[str], None],
                      capture_missing: bool = True, weights_dir=None) -> dict:
    """Capture what is missing (and say so), then verify every reference (checksum, schema, config) before anything
    launches. `keys` are (model, shape, kind)."""
    from harness.image_runs import capture_image, config_hash

    missing = sorted(key for key in keys if not reference_path(root, *key[:2], kind=key[2]).exists())
    if missing and not capture_missing:
        paths = ", ".join(str(reference_path(root, m, s, kind=k)) for m, s, k in missing)
        raise HarnessError(f"missing reference(s) {paths}: run `pytest --ref` or `harness capture` to create them")
    if missing:
        names = ", ".join(f"{m}@{s}/{k}" for m, s, k in missing)
        echo(f"capturing {len(missing)} missing reference(s) first: {names}")
        determinism.quiet_diffusers()
    for model, shape, kind in missing:
        if kind == "image":
            path, _ = capture_image(model, root, weights_dir=weights_dir if shape != "default" else None)
        else:
            path, _ = capture_one(get_spec(model), shape, root)
        echo(f"captured {path}")
    metas = {}
    for model, shape, kind in sorted(keys):
        path = reference_path(root, model, shape, kind=kind)
        expected = config_hash(model, weights_dir if shape != "default" else None) if kind == "image" \
            else get_spec(model).config_hash()
        read_reference(path, expected)
        metas[(model, shape, kind)] = read_meta(path)
    return metas
