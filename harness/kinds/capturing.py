"""What the zoo kinds' captures share (tensor, train): where the reference goes, kept unless forced, the model built
from its seed in strict fp32, and the metadata that says so. Written once, so that every zoo reference is made and
described alike. And what every capture records beside its output (image too): the per-module fingerprints of the
run that made it (harness.rank.fingerprint), with the one-device run that records them again later
(harness.engine.drift)."""

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


def one_device_case(kind: str, model: str, shape: str, weights_dir: str | None = None):
    """The run a reference records: its model on one device in fp32, PyTorch's own SDPA (`native`), eager, loaded
    as `enable_parallelism` loads it."""
    from harness.core.layouts import Layout
    from harness.core.records import Case

    return Case(model, Layout("single"), "native", "fp32", kind, shape=shape, weights_dir=weights_dir)


def fingerprinted(kind, case, reference, device, draw: str | None = None):
    """(fingerprints, output) of `case` (one device) built by `kind` from `reference`: every module's output and, for
    a kind with a loss (train), what every module's backward hands on at step 1 (harness.rank.fingerprint); `draw`:
    as that noise draw of it (harness.rank.noise)."""
    from harness.rank import backends, fingerprint, loading

    built = kind.build(case, reference, device, loading.enabled())
    if draw is not None:
        built.twin(draw)
    try:
        return fingerprint.record(built.module, built.forward or built.run, built.loss)
    finally:
        backends.reset_active_backend()


def module_record(found):
    """What a capture stores of each module (harness.core.reference.ModuleRecord): the fingerprints its own run
    recorded (harness.rank.fingerprint.Recorder around it), and the platform that ran it: there, one device reruns
    it bit for bit (docs/localization.md), elsewhere it rounds otherwise."""
    from harness.core.reference import ModuleRecord
    from harness.rank import fingerprint

    return ModuleRecord(found.parts(), {"platform": fingerprint.platform(), "projections": fingerprint.PROJECTIONS})
