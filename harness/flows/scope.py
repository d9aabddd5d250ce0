"""Which cases a flow has, what keeps one from running here, and what the installed diffusers refuses of it (read
from its own source, as the tensor-parallel guards are: harness.catalogue.tp_guards)."""

from __future__ import annotations

import importlib.util

from harness.core.applicability import NotApplicable
from harness.flows.registry import FlowValue, refusal_of, value_of


def exists(case, checkpoint: bool) -> bool:
    """Whether the case is in the flow's product at all: its kind and layout family, and a position the load leaves
    (nothing comes before `from_pretrained(..., parallel_config=...)` applies the layout)."""
    value = value_of(case.flow)
    if value.flow is None:
        return True
    return case.kind in value.flow.kinds and value.flow.exists_on(case.layout) and not (value.before and checkpoint)


def unavailable(case, model_class) -> str | None:
    """Why the case's flow cannot run here, or None: SKIP for a package this machine lacks, N/A for a method the
    installed release's model class does not have."""
    value = value_of(case.flow)
    if value.flow is None:
        return None
    missing = [name for name in value.flow.needs if importlib.util.find_spec(name) is None]
    if missing:
        return f"the {value.flow.name} flow needs {', '.join(missing)}, which is not installed"
    if value.flow.needs_accelerator and not _has_accelerator():
        return (f"the {value.flow.name} flow offloads to the CPU from an accelerator, and this machine has none "
                f"(diffusers refuses it on a CPU: 'requires accelerator, but not found')")
    lacking = [name for name in value.flow.needs_api if not hasattr(model_class, name)]
    if lacking:
        return NotApplicable(f"this diffusers' {model_class.__name__} has no {', '.join(lacking)} (the "
                             f"{value.flow.name} flow)")
    return _pipeline_lacks(case.model, value.flow)


def _pipeline_lacks(model: str, flow) -> NotApplicable | None:
    """N/A where the flow calls a pipeline's own loader and the model's pipeline has none (or the zoo gives the model
    no pipeline): users reach the call through the pipeline only."""
    if not flow.pipeline_api:
        return None
    from harness.catalogue.pipelines import pipeline_class

    found = pipeline_class(model)
    if found is None:
        return NotApplicable(f"the {flow.name} flow calls a pipeline's {', '.join(flow.pipeline_api)}, and {model} "
                             f"has no pipeline in the zoo")
    lacking = [name for name in flow.pipeline_api if not hasattr(found, name)]
    if lacking:
        return NotApplicable(f"this diffusers' {found.__name__} has no {', '.join(lacking)} (the {flow.name} flow)")
    return None


def _has_accelerator() -> bool:
    import torch

    return torch.accelerator.is_available()


def refusal(case) -> tuple[str, str] | None:
    """(why, the text of diffusers' error) where the installed release refuses the case's flow at its position on
    its layout; None where it does not (the flow then runs and is judged on its numbers)."""
    from harness.core import compat

    value: FlowValue = value_of(case.flow)
    refused = refusal_of(value, case.layout)
    if refused is None or refused.error not in compat.source_of(refused.module):
        return None
    return (f"diffusers refuses {value.flow.name} {value.position} enabling parallelism on {case.layout.name} "
            f"({refused.where})", refused.error)

