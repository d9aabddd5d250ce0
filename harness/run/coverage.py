"""`harness run --coverage`: what the ranks are told to measure, and the one report made of their data.

The modules come from harness.catalogue.coverage.scope, resolved once against the installed diffusers; every rank
process measures their files (harness.engine.tracer) into the run's coverage folder; after the last launch the data
of every process are combined once, each module's measured statements are read against them, and every statement
that never ran gets its reason (harness.catalogue.coverage.reasons).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from harness.catalogue.coverage import reasons, scope
from harness.core import axes
from harness.core.coverage import CoverageReport, FunctionCoverage, ModuleCoverage
from harness.core.errors import HarnessError
from harness.core.results import CaseResult

FOLDER = "coverage"  # under the run's work folder
SOURCE = "https://github.com/huggingface/diffusers/blob/{ref}/src/diffusers/{key}"


@dataclass
class Measure:
    folder: Path
    scopes: list[scope.ModuleScope]

    @property
    def files(self) -> list[str]:
        return [str(found.path) for found in self.scopes if found.path is not None]


def prepare(enabled: bool, workdir: Path, flows: bool = False) -> Measure | None:
    """What the ranks measure and where they write it; None when the run does not measure coverage. With `flows`
    (the run has flow cases) the modules the flows touch are measured too, as a group of their own."""
    if not enabled:
        return None
    try:
        import coverage  # noqa: F401 - checked here, before any rank starts
    except ImportError:
        raise HarnessError("option coverage: coverage.py is not installed here (pip install coverage, or "
                           "reinstall the harness: it is a dependency)") from None
    return Measure(workdir / FOLDER, scope.scopes(scope.PARTS + (scope.FLOW_PARTS if flows else ())))


def report(measure: Measure, results: list[CaseResult], environment: dict, kept: int = 0) -> CoverageReport:
    """Every rank process's data combined, read module by module and function by function, each gap with its
    reason. `kept`: cases `--resume` kept from an interrupted run, whose statements this run did not measure."""
    import coverage

    files = sorted(str(path) for path in measure.folder.glob("rank.*")) if measure.folder.exists() else []
    combined = coverage.Coverage(data_file=None, config_file=False)
    if files:
        combined.combine(files, keep=True)
    facts = plan_facts(results)
    ref = environment.get("diffusers_commit") or f"v{environment.get('diffusers')}"
    modules = [_module(found, facts, combined, ref) for found in measure.scopes]
    notes = ["no rank wrote coverage data"] if not files else []
    if kept:
        notes.append(f"{kept} case(s) kept by --resume ran in the interrupted run: their statements are not counted")
    note = "; ".join(notes)
    return CoverageReport(str(environment.get("diffusers")), modules, processes=len(files), note=note)


def _module(found: scope.ModuleScope, facts: reasons.Facts, combined, ref: str) -> ModuleCoverage:
    if found.path is None:
        return ModuleCoverage(found.key, found.part.title, absent=found.absent, group=found.part.group)
    # coverage.py's own analysis: the lines a rank traced mapped to their statements (a statement over several
    # lines may be traced on a later one)
    _, listed, _, never, _ = combined.analysis2(str(found.path))
    statements, ran = set(listed), set(listed) - set(never)
    functions = []
    for function in found.functions:
        measured = sorted(function.lines & statements)
        if not measured:
            continue
        executed = [line for line in measured if line in ran]
        missing = [line for line in measured if line not in ran]
        functions.append(FunctionCoverage(function.name, function.first, function.last, measured, executed,
                                          reasons.classify(found, function.name, missing, facts)))
    return ModuleCoverage(found.key, found.part.title, functions, source=SOURCE.format(ref=ref, key=found.key),
                          group=found.part.group)


def plan_facts(results: list[CaseResult]) -> reasons.Facts:
    """The axis values of every case that ran, the attention backends that do not run on this machine, and the
    functions of diffusers the CPU shims stand in for here."""
    from harness.rank import backends, cpu

    cases = [{name: str(getattr(result, name)) for name in axes.NAMES} for result in results
             if result.status.ran]
    names = {getattr(key, "value", str(key)): inspect.unwrap(function).__name__
             for key, function in backends.registry()._backends.items()}
    replaced = {f"{_key(module)}:{name}": why for (module, name), why in cpu.replaced().items()}
    return reasons.Facts(cases, {name: reason for name in names if (reason := _unavailable(name))}, names, replaced,
                         axes.NAMES)


def _key(module: str) -> str:
    return module.removeprefix("diffusers.").replace(".", "/") + ".py"


def _unavailable(name: str) -> str | None:
    """Why a backend runs in no dtype here (its bf16 probe's reason), or None."""
    from harness.rank import backends

    reasons_ = [backends.unavailable_reason(name, dtype) for dtype in ("bf16", "fp32")]
    return reasons_[0] if all(reasons_) else None
