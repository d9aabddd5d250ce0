"""Making a flow's calls on a model, in the order it declares them, and saying what they changed of it
(harness.flows.state): on every rank around `enable_parallelism`, and on one device, which may look at its output
between the calls (how far each call moved it).

How many calls a process makes is asked of `to_make`: all of them. The selftest's controls replace it on the ranks
they break, as a user's `if rank == 0:` around a call would (harness.faults.flows), so that every flow's case is shown
to notice a rank that did not make its calls.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.core.errors import HarnessError
from harness.flows import state
from harness.flows.registry import Call, Flow, FlowValue, Setting


def to_make(flow: Flow) -> int:
    """How many of the flow's calls this process makes, from the first: all of them."""
    return len(flow.calls)


def make_at(value: FlowValue, position: str, module, setting: Setting) -> list[str] | None:
    """The calls of `value` on a rank's `module` if they come at `position` (before or after enable_parallelism),
    and what they changed of it; None where no call is due there."""
    if value.flow is None or value.position != position:
        return None
    return make(value.flow, module, setting)


def make(flow: Flow, module, setting: Setting, after_each: Callable[[int, Call], None] | None = None) -> list[str]:
    """The flow's calls on `module`, `after_each(index, call)` after each but the last; what they changed of it."""
    before, wanted = state.snapshot(module), to_make(flow)
    steps = flow.stepwise(module, setting)
    for index, call in enumerate(flow.calls[:wanted]):
        if next(steps, _END) is _END:
            raise HarnessError(f"flow {flow.name!r} declares {len(flow.calls)} calls and its code made {index}")
        if after_each is not None and index < len(flow.calls) - 1:
            after_each(index, call)
    if wanted == len(flow.calls) and next(steps, _END) is not _END:
        raise HarnessError(f"flow {flow.name!r} declares {len(flow.calls)} calls and its code makes more")
    steps.close()
    return state.changes(before, state.snapshot(module))


_END = object()
