"""One device held to its stored reference by the reference's own noise, and where it first left it.

The run a reference records (one device, fp32, native SDPA, eager) is run again with every module fingerprinted
(harness.rank.fingerprint) and compared, module by module, with the fingerprints the reference stores. On the
platform that captured it (the same torch build, device and processor) that run reproduces it bit for bit (its
capture measured its own rerun: 0.0), so any module that moves at all is a change of the model, the backend, the
compiler or torch, however far inside the layouts' tolerance. Elsewhere rounding moves every module a little: each
module is held to `NOISE_FACTOR` x what this platform's own fp32 rounding moves it (the `nudged:1` noise draw of
the same run), and the limit says so. A fault that stands for a change to diffusers (`model_change`) is in force, as
it is for the single-device baselines.

Once per reference and run (rank 0): kept for the launch and handed to later launches through the baselines'
shared folder.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from harness import faults
from harness.core.records import Case
from harness.engine.context import RankContext
from harness.kinds import kind_of
from harness.kinds.capturing import fingerprinted, one_device_case
from harness.rank import backends, fingerprint, moved

NOISE_FACTOR = 2.0
NOISE_DRAW = "nudged:1"
_KEPT: dict[tuple, dict] = {}


def of(context: RankContext, shared: Path | None, case: Case) -> dict:
    """What the one-device run of `case`'s reference shows against it: {"line", "value", "limit", "derived",
    "forward", "backward"}, or {"absent": why} for a reference without fingerprints, or {"error": message}."""
    kind = kind_of(kind_of(case.kind).reference_kind)
    change = case.fault if faults.is_model_change(case.fault) else None
    key = (case.model, case.shape, kind.name, case.weights_dir, change, context.reference(case).meta.get("checksum"))
    if key not in _KEPT:
        _KEPT[key] = _shared(shared, key)
        if _KEPT[key] is None:
            with context.phase("one device against its reference"):
                _KEPT[key] = _measure(context, kind, replace(case, fault=change))
            _share(shared, key, _KEPT[key])
    return _KEPT[key]


def _measure(context: RankContext, kind, case: Case) -> dict:
    reference = context.reference(case)
    if not reference.modules:
        return {"absent": f"{reference.path} predates per-module fingerprints, so where one device leaves it cannot "
                          f"be located; recapture it (`harness capture --models {case.model} --kinds {kind.name} "
                          f"--shapes {case.shape} --force`)"}
    one = one_device_case(kind.name, case.model, case.shape, case.weights_dir)
    try:
        with faults.active(case.fault):
            found, _ = fingerprinted(kind, one, reference, context.device)
            limit, derived = _limits(context, kind, one, reference, found)
    except Exception as error:  # noqa: BLE001 - reported with the case, never fatal
        return {"error": backends.first_line(error)}
    traces = moved.compare(reference.modules, found.parts(), limit)
    worst = moved.worst(traces)
    return {"line": moved.summary(traces), "derived": derived,
            "value": worst["error"] if worst else None, "limit": worst["limit"] if worst else None,
            **{part: {"modules": trace.modules, "first": trace.first, "line": trace.line}
               for part, trace in traces.items()}}


def _limits(context: RankContext, kind, one: Case, reference, found) -> tuple:
    """(limit(part, module), how it was derived): on the platform that captured the reference, its own noise there
    (a one-device rerun is bit for bit: docs/measured.md), the fingerprint's resolution; elsewhere `NOISE_FACTOR` x
    this platform's fp32 rounding noise per module."""
    stored, here = reference.modules_about.get("platform", {}), fingerprint.platform()
    if stored:  # a file written before a key was recorded (the threads) is compared on the keys it has
        here = {key: value for key, value in here.items() if key in stored}
    if stored == here:
        return (lambda part, name: fingerprint.RESOLUTION), (f"its own noise: captured on this platform "
                                                             f"({_platform_text(here)}), where one device reruns it "
                                                             f"bit for bit")
    drawn, _ = fingerprinted(kind, one, reference, context.device, NOISE_DRAW)
    theirs = drawn.parts()
    noise = {(part, name): fingerprint.difference(value, other)
             for part, (names, values) in found.parts().items() if part in theirs
             for name, value, other in zip(names, values, theirs[part][1], strict=False)}
    differs = sorted(key for key in set(here) | set(stored) if here.get(key) != stored.get(key))
    return (lambda part, name: max(NOISE_FACTOR * noise.get((part, name), 0.0), fingerprint.RESOLUTION)), \
        (f"captured on another platform ({', '.join(differs)} differ: {_platform_text(stored)} there, "
         f"{_platform_text(here)} here): {NOISE_FACTOR:g} x this platform's fp32 rounding noise per module (the "
         f"{NOISE_DRAW} draw)")


def _platform_text(platform: dict) -> str:
    return ", ".join(str(platform[key]) for key in sorted(platform)) or "unknown"


def _file(shared: Path, key: tuple) -> Path:
    return shared / ("drift-" + hashlib.sha256(repr(key).encode()).hexdigest()[:24] + ".json")


def _shared(shared: Path | None, key: tuple) -> dict | None:
    if shared is None or not _file(shared, key).exists():
        return None
    return json.loads(_file(shared, key).read_text())


def _share(shared: Path | None, key: tuple, found: dict) -> None:
    if shared is None:
        return
    shared.mkdir(parents=True, exist_ok=True)
    partial = _file(shared, key).with_suffix(".partial")
    partial.write_text(json.dumps(found))
    partial.replace(_file(shared, key))
