"""Case ids given on the command line (`bisect --case`, `repro CASE_ID`): the plan options that make exactly those
cases, and the check that the plan of those options contains them (else one clear line, exit 2)."""

from __future__ import annotations

import re

from harness.core.errors import HarnessError
from harness.core.loads import ENABLE, LOADS
from harness.core.modes import EAGER

_LOAD = "|".join(name for name in LOADS if name != ENABLE)
_ID = re.compile(r"^(?P<model>[A-Za-z0-9_]+)(?:@(?P<shape>[A-Za-z0-9_]+))?/(?P<layout>[^/]+)/(?P<backend>[^/]+)"
                 rf"/(?P<dtype>[^/]+)/(?P<kind>[^/+]+)(?:/(?P<load>{_LOAD}))?(?:/(?P<mode>[^/+]+))?$")
# The options a case id fixes; with --models/--layouts/--shapes given, the train kind takes them too.
DERIVED = ("models", "shapes", "layouts", "backends", "dtypes", "kinds", "loads", "load_cases", "modes", "train_models",
           "train_layouts", "train_shapes")
FORMAT = ("model[@shape]/layout/backend/dtype/kind[/load][/mode], e.g. qwenimage@masked/ulysses2/native/fp32/tensor or "
          "flux/tp2/native/fp32/tensor/pretrained")


def parse_case_id(case_id: str) -> dict[str, str]:
    """{model, shape, layout, backend, dtype, kind, mode} of an id; a HarnessError for anything else (a fault suffix
    too: a deliberate bug is no finding to bisect or report)."""
    match = _ID.match(case_id.strip())
    if match is None:
        raise HarnessError(f"case id {case_id!r} is not of the form {FORMAT}")
    parts = match.groupdict()
    parts["shape"] = parts["shape"] or "default"
    parts["mode"] = parts["mode"] or EAGER
    parts["load"] = parts["load"] or ENABLE
    return parts


def plan_options(case_ids: list[str]) -> dict[str, str]:
    """The plan options (comma-separated values, as on the command line) whose plan holds every id in `case_ids`."""
    parsed = [parse_case_id(case_id) for case_id in case_ids]
    values = {part: ",".join(dict.fromkeys(item[part] for item in parsed))
              for part in ("model", "shape", "layout", "backend", "dtype", "kind", "load", "mode")}
    return {"models": values["model"], "shapes": values["shape"], "layouts": values["layout"],
            "backends": values["backend"], "dtypes": values["dtype"], "kinds": values["kind"],
            "loads": values["load"], "load_cases": "*", "modes": values["mode"]}


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
