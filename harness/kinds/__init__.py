"""Case kinds: what one case runs and how it is judged. Each kind is one module, the only code that knows it.

Callers look a kind up once (`kind_of(case.kind)`) and call it. A kind of the package is one module plus its line
below; a kind of your own is a module named in the environment variable `HARNESS_KINDS` (comma-separated, importable
from every rank) that calls `register(MyKind())` when imported: its options, checks and figures then reach the CLI,
pytest, `[tool.harness.<kind>]`, the plan, the verdict and every view, with no other file touched.
"""

from __future__ import annotations

from harness.core.modes import EAGER
from harness.core.registry import Registry
from harness.kinds.base import COMMON_CHECKS, Built, Check, Kind
from harness.kinds.image import ImageKind
from harness.kinds.refusal import RefusalKind
from harness.kinds.removal import RemovalKind
from harness.kinds.tensor import TensorKind
from harness.kinds.train import TrainKind
from harness.loads import load_of

KINDS: Registry[Kind] = Registry("kind", "HARNESS_KINDS")
ENV = KINDS.env


def register(kind: Kind) -> Kind:
    """Add a kind (its name must be new)."""
    return KINDS.add(kind.name, kind, type(kind).__module__)


def kind_of(name: str) -> Kind:
    return KINDS.of(name)


def known_checks() -> dict[str, Check]:
    """Every check a case can fail, by name."""
    found = dict(COMMON_CHECKS)
    for kind in KINDS.values():
        found.update(kind.checks)
    return found


def repro_template(case) -> tuple[str | None, str]:
    """The template under harness/versions/repro_scripts/ that `harness repro` scripts the case from, or None and
    why not: the scripts run eager, and the case's kind says which of its cases they reproduce."""
    if case.mode != EAGER:
        return None, (f"a compiled case is not scripted (the script runs eager; `harness run --modes {case.mode}` "
                      "runs it compiled)")
    if load_of(case.load).tensor_parallel_only:
        return None, (f"a {case.load} case is not scripted (a combination diffusers guards tensor parallelism "
                      f"against: `harness run --loads {case.load}` shows its refusal)")
    kind = kind_of(case.kind)
    template = kind.repro_script(case)
    return template, "" if template is not None else kind.repro_refusal(case)


for _kind in (TensorKind(), ImageKind(), TrainKind(), RemovalKind(), RefusalKind()):
    register(_kind)
KINDS.import_own()

__all__ = ["ENV", "KINDS", "Built", "Check", "Kind", "kind_of", "known_checks", "register", "repro_template"]
