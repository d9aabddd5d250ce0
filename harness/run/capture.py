"""Capture fp32 single-device references, and make sure every reference a plan needs exists and is sound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.catalogue.zoo import get_spec
from harness.core import determinism
from harness.core.errors import HarnessError
from harness.core.reference import read_meta, read_reference, reference_path
from harness.kinds import KINDS, kind_of
from harness.run.plan import check_weights


def reference_targets(models, kinds, shapes=None, weights_dir=None,
                      scopes: dict | None = None) -> list[tuple[str, str, str, str | None]]:
    """(kind, model, shape, weights folder) of every reference `harness capture` and `pytest --ref` write: each
    kind's shapes of each of its models (`scopes`: {kind: (models, layouts, shapes)}, default `models`), or only
    `shapes`."""
    models_of = {kind: (scopes or {}).get(kind, (models,))[0] for kind in kinds}
    specs = {name: get_spec(name) for names in models_of.values() for name in names}
    wanted = ["all"] if shapes is None else list(shapes)
    if "all" not in wanted:
        known = {shape for kind in kinds for name in models_of[kind]
                 for shape, _ in kind_of(kind).shapes(specs[name], ["all"], weights_dir)}
        if set(wanted) - known:
            raise HarnessError(f"unknown shape(s) {sorted(set(wanted) - known)} for {', '.join(specs)}; valid: "
                               f"{', '.join(sorted(known))}")
    return [(kind, name, shape, folder) for kind in kinds for name in models_of[kind]
            if kind_of(kind).captures(specs[name])
            for shape, folder in kind_of(kind).shapes(specs[name], wanted, weights_dir)]


def capture_one(kind: str, model: str, shape: str, root: Path, force: bool, weights_dir, settings=None):
    """One reference of `kind` (its options from `settings`), captured on the CPU threads a rank computes with:
    (path, written)."""
    options = kind_of(kind).capture_options(settings) if settings is not None else {}
    with determinism.as_a_rank_computes():
        return kind_of(kind).capture(model, shape, root, force, weights_dir, **options)


def capture_all(models, root: Path, force: bool = False, kinds=None, weights_dir=None,
                echo: Callable[[str], None] = print, shapes=None, settings=None) -> list[Path]:
    """Every reference of `models` x `kinds` (each kind's own models and options when `settings` is given)."""
    determinism.quiet_diffusers()
    paths = []
    scopes = settings.scopes if settings is not None else None
    kinds = list(KINDS) if kinds is None else kinds
    check_weights(weights_dir)
    for kind, model, shape, folder in reference_targets(models, kinds, shapes, weights_dir, scopes):
        path, written = capture_one(kind, model, shape, root, force, folder, settings)
        kept = f"kept     {path}" + (" (the recapture reproduces it)" if force else "")
        echo(f"captured {path}" if written else kept)
        paths.append(path)
    return paths


def ensure_references(cases, root: Path, echo: Callable[[str], None], capture_missing: bool = True,
                      settings=None) -> dict:
    """Capture what is missing (and say so), then verify every reference (checksum, schema, config, and that it
    fits the settings, e.g. the number of training steps) before anything launches. Returns each reference's
    metadata by (model, shape, kind)."""
    # one case speaks for its reference (a kind may read another kind's: `Kind.references`)
    needed = {(case.model, case.shape, kind_of(case.kind).reference_kind): case for case in cases}
    missing = sorted(key for key in needed if not reference_path(root, key[0], key[1], kind=key[2]).exists())
    if missing and not capture_missing:
        paths = ", ".join(str(reference_path(root, m, s, kind=k)) for m, s, k in missing)
        raise HarnessError(f"missing reference(s) {paths}: run `pytest --ref` or `harness capture` to create them")
    if missing:
        names = ", ".join(f"{m}@{s}/{k}" for m, s, k in missing)
        echo(f"capturing {len(missing)} missing reference(s) first: {names}")
        determinism.quiet_diffusers()
    for key in missing:
        case = needed[key]
        path, _ = capture_one(key[2], case.model, case.shape, root, False, case.weights_dir, settings)
        echo(f"captured {path}")
    metas = {}
    for key in sorted(needed):
        case, path = needed[key], reference_path(root, key[0], key[1], kind=key[2])
        read_reference(path, kind_of(key[2]).reference_hash(case))
        metas[key] = read_meta(path)
        stale = kind_of(key[2]).stale(metas[key], settings) if settings is not None else None
        if stale is not None:
            raise HarnessError(f"reference {path} {stale}")
    return metas
