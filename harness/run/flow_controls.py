"""A negative control for every flow, generated from the registry (harness.flows): every rank but rank 0 leaves out
the flow's calls (all of them; and for a flow of several calls, only its last), as a user's `if rank == 0:` around
them would. Its case must not PASS where its clean twin does: a flow whose control PASSes tests nothing, and
`harness selftest` says so.

What must catch it follows from what the left-out calls declare: calls that leave one device's output elsewhere are
caught by the numbers (the kind's own checks, or another rank's output); calls that keep it, by what they changed of
the model on each rank (`flow_calls`). A rank that skipped a cache's or a processor's calls runs other collectives
than rank 0: the ranks deadlock (a TIMEOUT naming both ranks' stacks), or gloo aborts one of them on a message of
another size than it expected (an ERROR naming the rank that died); and a rank that kept an adapter diffusers refuses
raises where rank 0 does not (an ERROR naming that rank). Each is the harness catching it too: never a PASS.

Each control runs where the flow exists, the installed diffusers does not refuse it (a refusal is judged by its
message, not by the numbers) and no known issue stands behind its clean twin: the first such of the flow families
(harness.kinds.base.FLOW_FAMILIES, tensor parallelism first: the findings that no entry can excuse, a deadlock,
are context parallelism's) on flux, fp32; where every layout has a known issue, the first whose issue is a wrong
result rather than a crash (a crash's entry would excuse the crash the control provokes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from harness import flows
from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.core.results import Status
from harness.flows import scope
from harness.kinds import kind_of
from harness.kinds.base import FLOW_FAMILIES

MODEL = "flux"
ALL, LAST = "flow_calls_rank0_only", "flow_last_call_rank0_only"  # the faults (harness.faults.flows)
CAUGHT_AS = (Status.FAIL, Status.TIMEOUT, Status.ERROR)  # an ERROR only where it names the rank that failed
CLEAN_AS = (Status.PASS, Status.XFAIL)  # XFAIL: a known issue of the flow the control must not hide behind


@dataclass(frozen=True)
class FlowControl:
    value: str  # the flow axis value
    fault: str  # ALL or LAST
    case: Case | None  # the faulty case; None: it cannot run here (`why`)
    why: str = ""

    @property
    def numbers(self) -> bool:
        """Whether the calls left out move one device's output: then the numbers must catch it."""
        found = flows.value_of(self.value).flow
        return found.changes_numbers if self.fault == ALL else found.calls[-1].effect == flows.CHANGES

    @property
    def label(self) -> str:
        return f"{self.value} ({'all calls' if self.fault == ALL else 'last call'})"

    @property
    def clean(self) -> Case:
        return replace(self.case, fault=None)

    def verdict(self, by_id: dict) -> tuple[str, str]:
        """(caught | MISSED | no run, what decided it) from the results by case id."""
        if self.case is None:
            return "no run", self.why
        faulty, clean = by_id[self.case.case_id], by_id[self.clean.case_id]
        if {faulty.status, clean.status} & {Status.SKIP, Status.NOT_APPLICABLE}:
            return "no run", (faulty.reason or clean.reason)[:80]
        if clean.status not in CLEAN_AS:
            return "MISSED", f"the clean twin is {clean.status.value}: {clean.reason[:60]}"
        if faulty.status not in CAUGHT_AS or (faulty.status is Status.ERROR and not faulty.reason.startswith("rank ")):
            return "MISSED", f"faulty {faulty.status.value}: {faulty.reason[:60]}"
        checks = {item["check"] for item in faulty.evidence}
        if faulty.status is Status.FAIL and self.numbers and not checks & _numbers_checks(self.case.kind):
            return "MISSED", f"FAIL by {', '.join(sorted(checks))} only: the numbers did not see it"
        if faulty.status is Status.FAIL:
            return "caught", ", ".join(sorted(checks))
        return "caught", "a hang, both ranks' stacks" if faulty.status is Status.TIMEOUT else faulty.reason[:60]


def _refused_on(case: Case) -> bool:
    """Whether the installed diffusers refuses the flow on the case's layout family; a refusal of some models on
    every layout (a block a cache's registry lacks: "all") is the model's, and flux is not refused it."""
    refused = flows.refusal_of(flows.value_of(case.flow), case.layout)
    return refused is not None and refused.layouts != "all" and scope.refusal(case) is not None


def _numbers_checks(kind: str) -> set[str]:
    return set(kind_of(kind).checks) | {"rank_output"}


def generate(values=None, known: Callable[[str], int] = lambda case_id: 0) -> list[FlowControl]:
    """Every flow value's controls (or those of `values`): one leaving out all its calls, and one leaving out its
    last where it makes several; `known(case_id)`: what stands behind the case, 0 no known issue, 1 a known wrong
    result or hang, 2 a known crash (which may excuse the very crash a rank that left a call out provokes: the same
    message, raised by the rank that made the calls)."""
    chosen = [name for name in (values or flows.VALUES) if name != flows.NONE]
    return [_control(name, fault, known) for name in chosen for fault in _faults(name)]


def _faults(value: str) -> tuple[str, ...]:
    return (ALL, LAST) if len(flows.value_of(value).flow.calls) > 1 else (ALL,)


def _control(value: str, fault: str, known: Callable[[str], bool]) -> FlowControl:
    found = flows.value_of(value).flow
    kind = "tensor" if "tensor" in found.kinds else found.kinds[0]
    cases = [Case(MODEL, parse_layout(layout), backend, "fp32", kind, fault=fault, flow=value)
             for layout, backend in sorted(FLOW_FAMILIES, key=lambda family: not family[0].startswith("tp"))]
    runnable = [case for case in cases if scope.exists(case, checkpoint=False) and not _refused_on(case)]
    if not runnable:
        return FlowControl(value, fault, None, "refused by this diffusers wherever it exists: a refusal is judged "
                                               "by its message")
    return FlowControl(value, fault, min(runnable, key=lambda case: known(replace(case, fault=None).case_id)))
