"""Case ids given on the command line (`bisect --case`, `repro CASE_ID`): the plan options that make exactly those
cases, and the check that the plan of those options contains them (else one clear line, exit 2)."""

from __future__ import annotations

from harness.core import axes
from harness.core.errors import HarnessError

# The options a case id fixes (the load and flow slices then take every case); with --models/--layouts/--shapes
# given, the train kind takes them too.
DERIVED = (*(axis.option for axis in axes.AXES), "load_cases", "flow_cases", "train_models", "train_layouts",
           "train_shapes")
EXAMPLE = "qwenimage@masked/ulysses2/native/fp32/tensor or flux/tp2/native/fp32/tensor/pretrained"


def parse_case_id(case_id: str) -> dict[str, str]:
    """Every axis's value of an id (harness.core.axes); a HarnessError for anything else, a fault suffix too: a
    deliberate bug is no finding to bisect or report."""
    try:
        values = axes.parse(case_id.strip())
    except ValueError as error:
        raise HarnessError(f"{error}, e.g. {EXAMPLE}") from None
    fault = values.pop("fault")
    if fault is not None:
        raise HarnessError(f"case id {case_id!r} is not of the form of a finding: {axes.FAULT}{fault} is a deliberate "
                           "bug (a negative control), nothing to bisect or report")
    return values


def plan_options(case_ids: list[str]) -> dict[str, str]:
    """The plan options (comma-separated values, as on the command line) whose plan holds every id in `case_ids`."""
    parsed = [parse_case_id(case_id) for case_id in case_ids]
    options = {axis.option: ",".join(dict.fromkeys(values[axis.name] for values in parsed)) for axis in axes.AXES}
    return {**options, "load_cases": "*", "flow_cases": "*"}  # in the plan whatever the plan's load and flow slices


def as_flags(options: dict[str, str]) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]


def planned(case_ids: list[str], overrides: dict | None = None) -> dict:
    """{case_id: PlannedCase} of each id, from the plan its options make (with the other `overrides`); a
    HarnessError naming the ids the plan does not contain."""
    from harness.run.runner import plan_from
    from harness.run.settings import load_settings

    options = plan_options(case_ids)
    try:
        settings = load_settings({**(overrides or {}), **options})
        plan = {item.case.case_id: item for item in plan_from(settings)}
    except HarnessError as error:
        raise HarnessError(f"case {', '.join(case_ids)}: {error}") from None
    missing = [case_id for case_id in case_ids if case_id.strip() not in plan]
    if missing:
        near = ", ".join(list(plan)[:4]) or "none"
        raise HarnessError(f"case {', '.join(missing)} is not in the plan: its options "
                           f"({' '.join(as_flags(options))}) plan {len(plan)} case(s): {near}")
    return {case_id: plan[case_id.strip()] for case_id in case_ids}
