"""What the zoo kinds' captures share (tensor, train): where the reference goes, kept unless forced, the model built
from its seed in strict fp32, and the metadata that says so. Written once, so that every zoo reference is made and
described alike."""

from __future__ import annotations

from pathlib import Path


def seeded_model(kind: str, model: str, shape: str, root: Path, force: bool):
    """(spec, path, module): the zoo spec of `model`, the path of `kind`'s reference of `shape` under `root`, and the
    model built from the spec's seed in strict fp32; the module is None when that reference exists and is kept (no
    `force`)."""
    import torch

    from harness.catalogue.zoo import get_spec
    from harness.core import determinism
    from harness.core.reference import reference_path

    spec = get_spec(model)
    path = reference_path(root, spec.name, shape, kind)
    if path.exists() and not force:
        return spec, path, None
    determinism.strict_fp32()
    return spec, path, spec.build().to(torch.float32)


def seeded_meta(spec, shape: str, kind: str, config_hash: str, **extra) -> dict:
    """What a zoo reference says of itself besides what every reference does: the model's class and seed."""
    from harness.core.reference import reference_meta

    return reference_meta(spec.name, shape, kind, spec.config, config_hash,
                          **{"class": spec.class_name, "seed": spec.seed, **extra})
