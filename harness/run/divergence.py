"""What a case's localization says, in one line, made true for the case it localizes.

Localization compares the layout with a single-device run recomputed in the same launch, module by module. When it
finds nothing, that is only half an answer for a case that failed: either the single-device run has the fault too
(the model, the backend or the compiler changed, not the parallelism: every module then matches), or what failed is
something no module's output or gradient shows (a parameter's own gradient). Saying "none" there would be untrue.
"""

from __future__ import annotations

from harness.core import figures
from harness.core.modes import EAGER
from harness.core.records import Localization
from harness.core.results import CaseResult

REFERENCE_HOLDS = ("the reference holds the final output only: localizing where the single-device run leaves it "
                   "needs a reference with every module's output")


def _where_one_device_left(result: CaseResult) -> str:
    """Where the single-device run first left the stored reference, module by module (harness.engine.drift), or why
    that cannot be said."""
    found = result.extra.get("drift") or {}
    line = found.get("line") or ""
    if line and not line.startswith(("none", "not localized")):
        return f"first off the stored reference: {line}"
    if found.get("absent"):
        return f"{REFERENCE_HOLDS} ({found['absent']})"
    if found.get("error"):
        return f"where it leaves the stored reference could not be traced ({found['error']})"
    return REFERENCE_HOLDS if not line else f"every module on its stored reference ({line}): what moved is after them"


def first_divergence(result: CaseResult, found: Localization) -> str:
    """The localization's line for `result`: the module it names, or why it names none."""
    line = found.summary
    if not line.startswith("none") or not result.evidence:  # a module named, not localized, or nothing failed
        return line
    single = figures.with_role(result.figures, figures.SINGLE_DEVICE)
    if single is not None and single.get("limit") is not None and not single["value"] <= single["limit"]:
        return (f"none between the layout and one device, and the single-device {result.dtype} run is off the "
                f"reference as far ({single['label']} {figures.written(single)} > {single['limit']:.3g}): the "
                f"model, the backend or the compiler changed, not the parallelism; {_where_one_device_left(result)}")
    if result.mode != EAGER:
        return (f"the divergence comes from compiling, not narrowed: {line.removeprefix('none: ')}; what compiling "
                "breaks shows only with the whole model compiled (fusion across modules)")
    failed = result.evidence[0]
    if failed["check"] == "repeat":  # no layout against one device: the layout against itself, run twice
        module = (result.extra.get("repeat") or {}).get("module")
        return f"does not repeat itself; {f'first at {module}' if module else 'not traced module by module'}"
    return (f"not localized: {line.removeprefix('none: ').removeprefix('none ')}, yet the case fails "
            f"({failed['text']}): what failed is no module's output or gradient (a parameter's own gradient, or "
            f"the run's output after the last module)")
