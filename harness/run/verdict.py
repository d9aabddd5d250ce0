"""Turn what a case produced into a verdict: errors and timeouts as they came, the numbers by the case's kind, then
the proof of what ran (a wrong backend fails even when its numbers agree), then expected refusals and known issues.
"""

from __future__ import annotations

from harness.core.records import Outcome
from harness.core.results import CaseResult, Status
from harness.kinds import Policy, kind_of
from harness.rank import comms_check
from harness.rank.kernels import dispatch_mismatch, function_mismatch, kernel_mismatch
from harness.run.known_issues import KnownIssue, find


def base_result(case) -> CaseResult:
    return CaseResult(case.case_id, case.model, case.shape, case.kind, case.layout.name, case.world_size,
                      case.backend, case.dtype)


def judge(outcome: Outcome, policy: Policy) -> CaseResult:
    result, record = base_result(outcome.case), outcome.record
    result.seconds, result.peak_mem_mb = record.seconds, record.peak_mem_mb
    timings = {"peak_mem_mb_per_rank": record.peak_mem_mb_per_rank, "seconds_per_rank": record.seconds_per_rank,
               "forward_s": record.forward_s, "phases": record.phases}
    result.extra.update({key: value for key, value in timings.items() if value not in (None, [])})
    result.dispatched = _counts(record.dispatched)
    if record.functions:
        result.extra["functions"] = record.functions
    result.kernels = _counts(record.kernels or {})
    _comms(result, record)
    if record.timeout:  # the ranks' stacks, taken before the kill, are its traceback
        result.status, result.reason = Status.TIMEOUT, record.error or "case timeout"
        if record.traceback:
            result.extra["traceback"] = record.traceback
        return result
    if record.failed:
        result.status = Status.ERROR
        result.reason = record.error if record.error_rank is None else f"rank {record.error_rank}: {record.error}"
        if record.traceback:
            result.extra["traceback"] = record.traceback
        return result
    result.status, result.reason = kind_of(outcome.case.kind).judge(result, record.metrics, policy)
    if result.status is Status.ERROR:  # the kind could not judge it (a failed baseline): nothing to add
        return result
    integrity = _integrity_failure(result, record, kind_of(outcome.case.kind).rank_tolerance(result))
    if integrity is not None:  # what rank 0's numbers cannot show: other ranks' outputs, the output's type
        numbers = f"; rank 0: {result.reason or 'within tolerance'}"
        result.status, result.reason = Status.FAIL, integrity + numbers
    proof = _proof_failure(outcome.case.backend, record)
    if proof is not None:  # a wrong backend fails even when its numbers happen to agree
        numbers = f"; numbers: {result.reason or 'within tolerance'}"
        result.status, result.reason = Status.FAIL, proof + numbers
        result.extra["proof_failure"] = True
    return result


def _integrity_failure(result: CaseResult, record, tolerance: float) -> str | None:
    """A rank whose output differs from rank 0's by more than the case's tolerance, or an output that is still a
    DTensor (a Shard or Partial placement diffusers should have gathered or reduced; `full_tensor()` would repair
    it silently)."""
    if record.rank_max_diff:
        result.extra["rank_max_diff"] = record.rank_max_diff
    if record.output_placements is not None:
        result.extra["output_placements"] = record.output_placements
        return f"the model returned a DTensor {record.output_placements} where diffusers returns a plain tensor"
    for rank, difference in enumerate(record.rank_max_diff):
        if difference is None:
            return f"rank {rank}'s output has another shape than rank 0's"
        if not difference <= tolerance:
            return f"rank {rank}'s output differs from rank 0's by {difference:.3g} (tolerance {tolerance:.3g})"
    return None


def _proof_failure(backend: str, record) -> str | None:
    """The name dispatched, then the kernels executed, then the identity of the function that ran: each proves what
    the one before cannot (a redirected entry counted under the right name, running the same kernel). Then the
    collectives: the right attention can still run on a rank's own chunk, or a layer skip its reduction."""
    mismatch = dispatch_mismatch(backend, record.dispatched)
    if mismatch is None and record.kernels is not None:
        mismatch = kernel_mismatch(backend, record.kernels)
    mismatch = mismatch or function_mismatch(backend, record.expected_function, record.functions)
    return mismatch or comms_check.comms_mismatch(record.comms_expected, record.comms)


def _comms(result: CaseResult, record) -> None:
    """The collectives column, and per module pattern what ran against what the layout needs (the detail)."""
    if record.comms is None:
        return
    result.comms = comms_check.totals(record.comms)
    result.extra["comms"] = comms_check.by_pattern(record.comms, record.comms_expected)


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{name}:{count}" for name, count in sorted(counts.items()))


def apply_expected_refusal(result: CaseResult, refusal) -> CaseResult:
    """A case the plan expected diffusers to refuse: the refusal seen is XFAIL; anything else is judged as it is
    (a backend that runs where diffusers should refuse is exactly what must not pass unseen)."""
    if refusal is None:
        return result
    if result.status is Status.ERROR and refusal.seen_in(result.reason):
        result.extra["observed"] = f"{result.status.value}: {result.reason}"
        result.status, result.reason = Status.XFAIL, f"expected refusal: {refusal.reason}; observed {result.reason}"
    elif result.status is Status.PASS:
        result.reason = f"diffusers ran it although a refusal was expected ({refusal.reason}); judged as usual"
    return result


def apply_known_issues(result: CaseResult, issues: list[KnownIssue]) -> CaseResult:
    """FAIL/ERROR on a listed case becomes XFAIL with the listed reason; a listed case that passes is XPASS. A proof
    failure (a wrong backend or kernel ran) is never a known issue: the numbers behind it are not the case's own."""
    if result.extra.get("proof_failure"):
        return result
    failed = result.status in (Status.FAIL, Status.ERROR)
    issue = find(issues, result.case_id, result.reason if failed else None, status=result.status.value,
                 max_abs_err=result.max_abs_err)
    if issue is None:
        return result
    result.extra["known_issue"] = issue.match if isinstance(issue.match, str) else list(issue.match)
    if failed:
        result.extra["observed"] = f"{result.status.value}: {result.reason}"
        result.status, result.reason = Status.XFAIL, f"{issue.describe()}; observed {result.reason}"
    elif result.status is Status.PASS:
        result.status = Status.XPASS
        result.reason = f"known issue no longer reproduces (XPASS): {issue.reason}; remove or narrow its entry"
    return result


def not_run(planned) -> CaseResult:
    """A case decided at plan time: SKIP with its reason, or ERROR when what it needs is known to be broken."""
    result = base_result(planned.case)
    if planned.plan_error is not None:
        result.status, result.reason = Status.ERROR, planned.plan_error
    else:
        result.status, result.reason = Status.SKIP, planned.skip_reason
    return result
