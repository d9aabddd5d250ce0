"""The flow part of a `harness repro` script (a case with a flow, harness/flows): the flow's family module as the
harness runs it, so the script makes exactly the harness's calls (the same seeded LoRA, the same processors), with
the registry's decorator and declarations replaced by stand-ins: the script imports no harness. The registry's own
`Setting` is copied in, the one thing the flow's call is given besides the model."""

from __future__ import annotations

import inspect
import re
import sys

from harness import flows
from harness.core.errors import HarnessError

# What the family modules import from the registry, as the script has them: `@flow(...)` keeps the code as it is;
# the calls' declarations (`Call`), the model they must equal (`Equivalent`) and a declared refusal (`Refused`) are
# the harness's expectations, nothing to run.
STAND_INS = '''
from dataclasses import dataclass


def flow(*calls, **declared):  # the harness's registry (harness/flows/registry.py): the decorated code as it is
    return lambda code: code


def Call(*args):  # a call's declaration: what the harness expects of it, nothing to run
    return None


Equivalent = Refused = Call  # the model the calls must equal, what diffusers must refuse: expectations too
AFTER, BEFORE, CHANGES, KEEPS = "after", "before", "changes", "keeps"
'''
_HEAD = re.compile(r'\A(?:""".*?"""\n|from __future__ import annotations\n'
                   r"|from harness\.flows\.registry import [^\n]*\n|\s*\n)*", re.S)


def flow_data(case) -> dict | None:
    """What CASE says of the case's flow: its call, in words, and its position (None without a flow)."""
    value = flows.value_of(case.flow)
    if value.flow is None:
        return None
    return {"name": value.name, "call": value.flow.help, "position": value.position}


def flow_part(case) -> str:
    """The script's code of the case's flow ("" without one): stand-ins, `Setting`, the family module, and `FLOW`,
    the call `flow_calls` of the common part makes."""
    value = flows.value_of(case.flow)
    if value.flow is None:
        return ""
    module = sys.modules[value.flow.code.__module__]
    family = inspect.getsource(module)
    if "harness." in _HEAD.sub("", family, count=1):
        raise HarnessError(f"repro: {case.case_id}: the {value.flow.name} flow's module {module.__name__} uses more "
                           "of the harness than its registry, which a script cannot carry: not scripted")
    return (f"\n\n# --- the flow: {module.__name__} as the harness runs it ---\n{STAND_INS}\n\n"
            f"{inspect.getsource(flows.Setting)}\n\n{_HEAD.sub('', family, count=1)}\n\n"
            f"def FLOW(module, *setting):  # the common part's flow_calls calls it: every call, in order\n"
            f"    for _ in {value.flow.name}(module, Setting(*setting)) or ():  # a flow of several calls yields\n"
            f"        pass\n{_inputs_part(value.flow, case.kind)}")


def _inputs_part(found, kind: str) -> str:
    """`FLOW_INPUTS`, what the flow passes with each call of the case's kind (`Flow.inputs`), where it passes any."""
    passed = found.inputs.get(kind)
    if passed is None:
        return ""
    return f"\n\nFLOW_INPUTS = {passed.__name__}  # the forward's keyword arguments besides, drawn each call\n"
