"""The embedded tiny zoo: one spec per diffusers transformer class, seeded and small enough for a CPU."""

from __future__ import annotations

from harness.errors import HarnessError
from harness.zoo.spec import ModelSpec, Shape
from harness.zoo import flux, flux2, qwenimage

SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (flux.SPEC, flux2.SPEC, qwenimage.SPEC)}


def get_spec(name: str) -> ModelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise HarnessError(f"unknown model {name!r}; valid models: {', '.join(SPECS)}") from None


__all__ = ["SPECS", "ModelSpec", "Shape", "get_spec"]
