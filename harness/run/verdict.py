"""Turn what a case produced into a verdict: errors and timeouts as they came, the numbers by the case's kind, then
the proof of what ran (a wrong backend fails even when its numbers agree), then expected refusals and known issues.
"""

from __future__ import annotations

import shlex
import traceback

from harness import flows
from harness.core import applicability, evidence, figures
from harness.core.evidence import Evidence, status_of
from harness.core.figures import table
from harness.core.records import Outcome, without_fault
from harness.core.results import CaseResult, Status
from harness.kinds import kind_of, repro_template
from harness.kinds.base import COMPILE_FIGURES
from harness.rank import comms_check
from harness.rank.kernels import dispatch_mismatch, function_mismatch, kernel_mismatch
from harness.run import decisions, flow_checks, reference_drift, repeats
from harness.run.known_issues import KnownIssue


def base_result(case) -> CaseResult:
    return CaseResult(case.case_id, world_size=case.world_size, **case.axis_values())


def judge(outcome: Outcome, settings) -> CaseResult:
    """The case's result: what its run recorded, judged by its kind against the kind's policy for its dtype. A judge
    that raises (a harness bug, or a kind of one's own, `HARNESS_KINDS`) makes this case an ERROR that keeps the
    traceback: the run goes on, and its other results and reports are not lost with it."""
    try:
        return _judge(outcome, settings)
    except Exception as error:  # noqa: BLE001 - a case that cannot be judged is its ERROR, never the run's
        result = base_result(outcome.case)
        result.extra["traceback"] = traceback.format_exc()
        return settle(result, [Evidence("error", f"judging this case raised {type(error).__name__}: {error} (a bug of "
                                                 f"the harness or of the {outcome.case.kind!r} kind's judge)")])


def _judge(outcome: Outcome, settings) -> CaseResult:
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
        if record.traceback:
            result.extra["traceback"] = record.traceback
        rank = "" if record.error_rank is None else f"rank {record.error_rank}"
        return settle(result, [Evidence("error", f"{rank}: {record.error}" if rank else record.error, rank)])
    kind = kind_of(outcome.case.kind)
    policy = kind.policy(settings, outcome.case.dtype)
    # what a flow's calls did is measured on one device in fp32, whatever the case's dtype: held to fp32's limit (a
    # bf16 one let PyramidAttentionBroadcast's cond/uncond state shared on one device pass)
    flow_policy = kind.policy(settings, flows.ONE_DEVICE_DTYPE)
    numbers = kind.judge(result, record.metrics, policy)
    if record.warnings:  # evidence beside the verdict (SeaCache's fail-open says it warned), never a check of its own
        result.extra.setdefault("blocks", []).append(
            table("What diffusers warned of while the case ran (rank 0)", ["warning"], [[w] for w in record.warnings]))
    reference_drift.judge(result, record.metrics)  # one device against its stored reference: a figure, not a check
    # First what a wrong backend or a skipped exchange proves (the numbers behind it are not the case's own), then
    # what rank 0's numbers cannot show (other ranks' outputs, the output's type), then the numbers.
    items = _proof_failures(outcome.case, record) + _integrity_failures(result, record,
                                                                             kind.rank_tolerance(policy))
    return settle(result, items + _load_failures(result, record)
                  + flow_checks.failures(result, record, kind.flow_effect_limit(flow_policy))
                  + decisions.failures(result, record.steps, record.step_labels) + numbers
                  + repeats.judge(result, record.metrics, outcome.case.backend)
                  + _compile_failures(result, record, settings.fullgraph))


def settle(result: CaseResult, items: list[Evidence]) -> CaseResult:
    """The status and reason that follow from the failed checks, which are kept with the result, and the check
    that decided it (every view's cell)."""
    result.status, result.reason = status_of(items), evidence.reason(items)
    result.evidence = [item.to_dict() for item in items]
    # not a failed proof: its count is held from below, and its failure is what it is whatever the numbers say
    result.deciding = figures.deciding(result.figures, [item for item in result.evidence if not item["check"]
                                                        .startswith(evidence.PROOF)])
    return result


def _integrity_failures(result: CaseResult, record, tolerance: float | None) -> list[Evidence]:
    """A rank whose output differs from rank 0's by more than the case's tolerance, or an output that is still a
    DTensor (a Shard or Partial placement diffusers should have gathered or reduced; `full_tensor()` would repair
    it silently). `tolerance` None: the kind compares the ranks itself."""
    if record.rank_max_diff:
        result.extra["rank_max_diff"] = record.rank_max_diff
    found = []
    if record.output_placements is not None:
        result.extra["output_placements"] = record.output_placements
        found.append(Evidence("dtensor_output", f"the model returned a DTensor {record.output_placements} where "
                                                "diffusers returns a plain tensor", record.output_placements))
    if tolerance is None:
        return found
    for rank, difference in enumerate(record.rank_max_diff):
        if difference is None:
            found.append(Evidence("rank_output", f"rank {rank}'s output has another shape than rank 0's",
                                  f"rank {rank}"))
        elif not difference <= tolerance:
            found.append(Evidence("rank_output", f"rank {rank}'s output differs from rank 0's by {difference:.3g} "
                                                 f"(tolerance {tolerance:.3g})", f"rank {rank}", difference,
                                  tolerance))
    return found


def _proof_failures(case, record) -> list[Evidence]:
    """The name dispatched, then the kernels executed, then the identity of the function that ran: each proves what
    the one before cannot (a redirected entry counted under the right name, running the same kernel). Then the
    collectives: the right attention can still run on a rank's own chunk, or a layer skip its reduction."""
    found, backend, layout = [], case.backend, case.layout
    mismatch = dispatch_mismatch(backend, record.dispatched)
    if mismatch is not None:
        found.append(Evidence("proof.dispatch", mismatch, backend))
    elif record.kernels is not None and (mismatch := kernel_mismatch(backend, record.kernels)) is not None:
        found.append(Evidence("proof.kernel", mismatch, backend))
    mismatch = function_mismatch(backend, record.expected_function, record.functions)
    if mismatch is not None:
        found.append(Evidence("proof.function", mismatch, backend))
    missing = _comms_failures(record)
    if not missing and record.compiled is not None and record.comms is not None and not record.comms_expected and (
            layout.is_context_parallel or layout.is_torch_context_parallel or layout.tp > 1):
        missing = [Evidence(PROOF_COMMS, "communication: under compile the graphs named none of the modules the "
                                         "layout predicts exchanges for, so nothing proves them")]
    return found + missing


def _comms_failures(record) -> list[Evidence]:
    """One failed check per predicted exchange that did not happen, named `<module>: <collective>` with the count
    seen against the count predicted: what a known issue must name exactly to excuse it (harness.run.known_issues);
    the first says how many of the predicted exchanges are missing, so the reason reads as one sentence."""
    short, predicted = comms_check.shortfalls(record.comms_expected, record.comms)
    return [Evidence(PROOF_COMMS, (comms_check.MISSING.format(len(short), predicted) if n == 0 else "") + item.text,
                     f"{item.module or '(model)'}: {item.collective}", item.got, item.at_least)
            for n, item in enumerate(short)]


def _load_failures(result: CaseResult, record) -> list[Evidence]:
    """A checkpoint load (harness.loads): how it was called, and each parameter whose local shard on a rank
    differs from what `enable_parallelism` gives on the same layout (the wrong slice, file or rank read), named with
    its rank; the numbers may still pass, the weights are not the checkpoint's."""
    if record.load is None:
        return []
    load = record.load
    result.extra["load"] = {key: value for key, value in load.items() if value not in (None, {}, [], False)}
    rows = [["call", load["call"]], ["parameters checked per rank", load.get("params")]]
    if load.get("note"):
        rows.append(["note", load["note"]])
    if not load.get("differing"):
        rows.append(["local shards vs enable_parallelism's", "equal, bit for bit, on every rank"])
    if load.get("unconfigured"):
        rows.append(["parallel config of the model run", "none: another model took the loaded one's place"])
    rows += [[f"differs on rank {rank}", ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                                                 else "")]
             for rank, names in load.get("differing", {}).items()]
    result.extra.setdefault("blocks", []).append(table("How the model was loaded", ["", ""], rows))
    found = []
    if load.get("unconfigured"):
        found.append(Evidence("load_config", "the model the case ran carries no parallel config, though "
                                             "from_pretrained was given one: another model took its place (a "
                                             "pipeline that loaded its own transformer over the one passed in)"))
    return found + [Evidence("load_shards", f"rank {rank}: the local shard of {name} from from_pretrained differs "
                                            f"from enable_parallelism's on the same layout", f"rank {rank}: {name}")
                    for rank, names in load.get("differing", {}).items() for name in names]


def _compile_failures(result: CaseResult, record, fullgraph: bool) -> list[Evidence]:
    """A compiled case's graphs, graph breaks and recompiles as figures, Dynamo's reasons for each break in the
    detail with what the proof could not see; a measured run that ran no compiled graph is a proof FAIL, and under
    `fullgraph` a graph break is FAIL."""
    if record.compiled is None:
        return []
    found = dict(record.compiled)
    graphs, breaks, recompiles = COMPILE_FIGURES
    result.figures += [graphs.of(found["graphs"]), breaks.of(found["graph_breaks"], 0 if fullgraph else None),
                       recompiles.of(found["recompiles"])]
    reasons = found.get("break_reasons") or {}
    if reasons:
        result.extra.setdefault("blocks", []).append(
            table("Graph breaks (Dynamo's reasons)", ["reason", "count"], [[text, n] for text, n in reasons.items()]))
    result.extra["compiled"] = {key: found[key] for key in ("mode", "executions", "notes") if key in found}
    items = []
    if not any(found.get("executions") or ()):  # Dynamo skipped the frame, or fell back: an eager run is no proof
        items.append(Evidence("proof.compiled", f"{found['mode']}: the measured run executed no compiled graph "
                                                f"({found['graphs']} compiled), so it ran eager"))
    if fullgraph and found["graph_breaks"]:
        first = next(iter(reasons), "")
        items.append(Evidence("graph_break", f"--fullgraph: {found['graph_breaks']} graph break(s) under "
                                             f"{found['mode']} ({first})", value=found["graph_breaks"], limit=0))
    return items


def _comms(result: CaseResult, record) -> None:
    """The collectives column, and per module pattern what ran against what the layout needs (the detail)."""
    if record.comms is None:
        return
    result.comms = comms_check.totals(record.comms)
    result.extra["comms"] = comms_check.by_pattern(record.comms, record.comms_expected)


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{name}:{count}" for name, count in sorted(counts.items()))


PROOF_COMMS = "proof.comms"  # the communication proof's check: one item per missing exchange
REFUSED_BY = "refused"  # the key an error item of a REFUSED case carries: the refusal that expected it


def apply_expected_refusal(result: CaseResult, refusal) -> CaseResult:
    """A case the plan expected diffusers to refuse: the refusal seen is REFUSED (diffusers' correct behaviour, its
    error item marked with the refusal that expected it); anything else is judged as it is (a backend that runs
    where diffusers should refuse is exactly what must not pass unseen)."""
    if refusal is None:
        return result
    if result.status is Status.ERROR and refusal.seen_in(result.reason):
        result.extra["observed"] = f"{result.status.value}: {result.reason}"
        result.evidence = [{**item, REFUSED_BY: refusal.reason} if item.get("check") == "error" else item
                           for item in result.evidence]
        result.status, result.reason = Status.REFUSED, f"expected refusal: {refusal.reason}; observed {result.reason}"
    elif result.status is Status.PASS:
        result.reason = f"diffusers ran it although a refusal was expected ({refusal.reason}); judged as usual"
    return result


def apply_known_issues(result: CaseResult, issues: list[KnownIssue]) -> CaseResult:
    """A FAIL/ERROR becomes XFAIL only when every failed check is excused by an entry that names it (its check, its
    subject, its figure band, its text), REFUSED when each of those entries is a refusal; what is left over keeps the
    case FAIL/ERROR, said first, with the excused items after ("also known: ..."). A failed proof only as its entry
    names it exactly (harness.run.known_issues: the exchange, the counts seen and predicted); a wrong backend or
    kernel never: the numbers behind it are not the case's own. A listed case that passes is XPASS. A negative control
    answers to the entries of the case it injects its fault into: the fault's own evidence is what must be left."""
    listed = [issue for issue in issues if issue.applies(without_fault(result.case_id))]
    if not listed:
        return result
    if result.status is Status.TIMEOUT:
        return _known_hang(result, listed)
    if result.status is Status.PASS:
        result.extra["known_issue"] = [issue.key for issue in listed]
        result.known_issues = [issue.reference() for issue in listed]
        result.status = Status.XPASS
        result.reason = f"known issue no longer reproduces (XPASS): {listed[0].reason}; remove or narrow its entry"
        return result
    if result.status not in (Status.FAIL, Status.ERROR) or not result.evidence:
        return result
    items = [Evidence.from_dict(item) for item in result.evidence]
    excused = {index: issue for index, item in enumerate(items)
               if (issue := next((issue for issue in listed if issue.excuses(item)), None)) is not None}
    if not excused:
        return result
    used = [issue for issue in listed if any(found is issue for found in excused.values())]
    result.extra["known_issue"] = [issue.key for issue in used]
    result.known_issues = [issue.reference() for issue in used]
    result.evidence = [_excused(item, excused[index], items[index]) if index in excused else item
                       for index, item in enumerate(result.evidence)]
    left = [item for index, item in enumerate(items) if index not in excused]
    observed = f"{result.status.value}: {result.reason}"
    if not left:  # every entry a refusal: diffusers refused as expected; else a known bug
        result.extra["observed"] = observed
        result.status = Status.REFUSED if all(issue.is_refusal for issue in used) else Status.XFAIL
        result.reason = f"{'; '.join(issue.describe() for issue in used)}; observed {result.reason}"
        return result
    result.extra["observed"] = observed
    known = evidence.reason([item for index, item in enumerate(items) if index in excused])
    result.status = status_of(left)
    result.reason = f"{evidence.reason(left)}; also known: {known} ({'; '.join(issue.short for issue in used)})"
    return result


def _known_hang(result: CaseResult, listed: list[KnownIssue]) -> CaseResult:
    """A TIMEOUT is XFAIL where an entry names the place its ranks hung (a text of their stacks); a hang anywhere
    else stays TIMEOUT."""
    stacks = f"{result.reason}\n{result.extra.get('traceback', '')}"
    issue = next((issue for issue in listed if issue.excuses_hang(stacks)), None)
    if issue is None:
        return result
    result.extra.update(observed=f"{result.status.value}: {result.reason}", known_issue=[issue.key])
    result.known_issues = [issue.reference()]
    result.status, result.reason = Status.XFAIL, f"{issue.describe()}; observed {result.reason}"
    return result


def _excused(item: dict, issue: KnownIssue, found: Evidence) -> dict:
    """A failed check as an entry excuses it: the entry's key, and the band its figure sat in where it has one."""
    band = issue.band(found)
    return {**item, "known": issue.key, **({"band": list(band)} if band is not None else {})}


def note_repro(result: CaseResult, case) -> CaseResult:
    """A FAIL that `harness repro` can script gets the command that writes its standalone script (what a maintainer
    attaches to an upstream report); the terminal and the page show it. A negative control is the harness's own
    bug, not one to report."""
    if result.status is Status.FAIL and case.fault is None and repro_template(case)[0] is not None:
        result.extra["repro"] = f"harness repro {shlex.quote(result.case_id)}"
    return result


def not_run(planned) -> CaseResult:
    """A case decided at plan time: SKIP or N/A with its reason (as the reason's code declared it), or ERROR when
    what it needs is known to be broken."""
    result = base_result(planned.case)
    if planned.plan_error is not None:
        result.status, result.reason = Status.ERROR, planned.plan_error
    else:
        result.status, result.reason = applicability.status_of(planned.skip_reason), str(planned.skip_reason)
    return result
