"""Case kinds: what one case runs and how it is judged. Each kind is one module, the only code that knows it.

Callers look a kind up once (`kind_of(case.kind)`) and call it; adding a kind is one module plus its entry here.
"""

from __future__ import annotations

from harness.core.errors import HarnessError
from harness.kinds.base import COMMON_CHECKS, Built, Check, Kind, Policy
from harness.kinds.image import ImageKind
from harness.kinds.tensor import TensorKind
from harness.kinds.train import TrainKind

KINDS: dict[str, Kind] = {kind.name: kind for kind in (TensorKind(), ImageKind(), TrainKind())}


def kind_of(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise HarnessError(f"unknown kind {name!r}; valid kinds: {', '.join(KINDS)}") from None


def known_checks() -> dict[str, Check]:
    """Every check a case can fail, by name."""
    found = dict(COMMON_CHECKS)
    for kind in KINDS.values():
        found.update(kind.checks)
    return found


__all__ = ["KINDS", "Built", "Check", "Kind", "Policy", "kind_of", "known_checks"]
