"""Case kinds: what one case runs and how it is judged. Each kind is one module, the only code that knows it.

Callers look a kind up once (`kind_of(case.kind)`) and call it; adding a kind is one module plus its entry here.
"""

from __future__ import annotations

from harness.core.errors import HarnessError
from harness.kinds.base import Built, Kind, Policy
from harness.kinds.image import ImageKind
from harness.kinds.tensor import TensorKind
from harness.kinds.train import TrainKind

KINDS: dict[str, Kind] = {kind.name: kind for kind in (TensorKind(), ImageKind(), TrainKind())}


def kind_of(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise HarnessError(f"unknown kind {name!r}; valid kinds: {', '.join(KINDS)}") from None


__all__ = ["KINDS", "Built", "Kind", "Policy", "kind_of"]
