"""The embedded tiny zoo: one spec per diffusers transformer class with a parallel plan, seeded and CPU-sized.

`harness.catalogue.zoo.discover.parallel_classes()` lists the classes of the installed diffusers that define
`_cp_plan` or `_tp_plan`; each must have a spec here or an entry in NOT_COVERED saying why (tests/unit/test_zoo.py
checks).
"""

from __future__ import annotations

from harness.catalogue.zoo import chronoedit, flux, flux2, helios, ltx, ltx2, minimax_h3, qwenimage, qwenimage21, wan
from harness.catalogue.zoo.spec import ModelSpec, Shape
from harness.core.errors import HarnessError

SPECS: dict[str, ModelSpec] = {
    module.SPEC.name: module.SPEC
    for module in (flux, flux2, qwenimage, qwenimage21, wan, chronoedit, helios, ltx, ltx2, minimax_h3)
}
SPECS[helios.AMPLIFY_SPEC.name] = helios.AMPLIFY_SPEC

# Classes with a parallel plan that deliberately have no spec: {class_name: why}. Empty: every class found in
# diffusers 0.42.1 is covered.
NOT_COVERED: dict[str, str] = {}


def get_spec(name: str) -> ModelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise HarnessError(f"unknown model {name!r}; valid models: {', '.join(SPECS)}") from None


__all__ = ["NOT_COVERED", "SPECS", "ModelSpec", "Shape", "get_spec"]
