"""Turn what a case produced into a verdict under the tolerance policy.

fp32: max abs error against the fp32 reference within the fp32 tolerance.
Low precision: within the dtype's fixed tolerance AND within the error budget: the mean abs error may exceed
the single-device run of the same dtype and backend by at most `budget_factor`. NaN/Inf never passes.
"""

from __future__ import annotations

from harness.kernels import dispatch_mismatch, kernel_mismatch
from harness.known_issues import KnownIssue, find
from harness.launch import Outcome
from harness.results import CaseResult, Status


def base_result(case) -> CaseResult:
    return CaseResult(case.case_id, case.model, case.shape, case.kind, case.layout.name, case.world_size,
                      case.backend, case.dtype)


def judge(outcome: Outcome, tolerance: float, budget_factor: float, image_limits: dict | None = None) -> CaseResult:
    result, record = base_result(outcome.case), outcome.record
    result.seconds = record.get("seconds")
    result.peak_mem_mb = record.get("peak_mem_mb")
    result.extra.update({key: record[key] for key in ("abs_err_hist", "peak_mem_mb_per_rank", "seconds_per_rank",
                                                      "forward_s") if key in record})
    result.dispatched = _counts(record.get("dispatched", {}))
    result.kernels = _counts(record.get("kernels", {}))
    if outcome.timeout:
        result.status, result.reason = Status.TIMEOUT, record.get("error", "case timeout")
        return result
    if "error" in record:
        rank = record.get("error_rank")
        result.status = Status.ERROR
        result.reason = record["error"] if rank is None else f"rank {rank}: {record['error']}"
        if record.get("traceback"):
            result.extra["traceback"] = record["traceback"]
        return result
    if outcome.case.kind == "image":
        result.status, result.reason = _image_verdict(result, record, image_limits)
    else:
        for key in ("max_abs_err", "mean_abs_err", "max_rel_err", "nonfinite"):
            setattr(result, key, record[key])
        result.tolerance = tolerance
        result.status, result.reason = _numbers_verdict(result, record, budget_factor)
    proof = _proof_failure(outcome.case.backend, record)
    if proof is not None:  # a wrong backend fails even when its numbers happen to agree
        numbers = f"; numbers: {result.reason or 'within tolerance'}"
        result.status, result.reason = Status.FAIL, proof + numbers
    return result


def _image_verdict(result: CaseResult, record: dict, limits: dict) -> tuple[Status, str]:
    """SSIM, PSNR and max pixel error within the dtype's limits against the fp32 picture and, for low precision,
    against the single-device picture of the same dtype (the baseline to beat)."""
    from harness.image_metrics import violations

    for key in ("ssim", "psnr", "max_abs_err", "mean_abs_err", "nonfinite"):
        setattr(result, key, record.get(key))
    result.tolerance = limits["max_abs_err_max"]
    result.extra.update({key: record[key] for key in ("images", "baseline", "vs_baseline") if key in record})
    if result.nonfinite:
        return Status.FAIL, f"image has {result.nonfinite} non-finite values (NaN/Inf)"
    broken = [f"vs fp32 reference: {text}" for text in violations(record, limits)]
    if "vs_baseline" in record:
        result.baseline_err = record["baseline"]["mean_abs_err"]
        broken += [f"vs single-device {result.dtype}: {text}" for text in violations(record["vs_baseline"], limits)]
    return (Status.FAIL, "; ".join(broken)) if broken else (Status.PASS, "")


def _proof_failure(backend: str, record: dict) -> str | None:
    mismatch = dispatch_mismatch(backend, record.get("dispatched", {}))
    if mismatch is None and "kernels" in record:
        mismatch = kernel_mismatch(backend, record["kernels"])
    return mismatch


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{name}:{count}" for name, count in sorted(counts.items()))


def _numbers_verdict(result: CaseResult, record: dict, budget_factor: float) -> tuple[Status, str]:
    # How far the layout is from the single-device run of the same model: kept on FAIL too, where it tells a
    # changed model (layouts agree, ~1e-7) from a parallel bug.
    result.extra["vs_baseline_max_abs"] = record.get("vs_baseline_max_abs")
    if result.nonfinite:
        return Status.FAIL, f"output has {result.nonfinite} non-finite values (NaN/Inf)"
    if not result.max_abs_err <= result.tolerance:
        return Status.FAIL, f"max abs err {result.max_abs_err:.3g} > tolerance {result.tolerance:.3g}"
    if result.dtype == "fp32":
        return Status.PASS, ""
    baseline = record.get("baseline")
    if baseline is None:
        return Status.PASS, f"no error budget: single-device {result.dtype} run failed ({record.get('baseline_error')})"
    result.baseline_err = baseline["mean_abs_err"]
    result.err_ratio = result.mean_abs_err / result.baseline_err if result.baseline_err > 0 else float("inf")
    if result.err_ratio > budget_factor:
        return Status.FAIL, (f"error budget: mean abs err {result.mean_abs_err:.3g} is {result.err_ratio:.2f}x the "
                             f"single-device {result.dtype} error {result.baseline_err:.3g} (budget {budget_factor}x)")
    return Status.PASS, ""


def apply_known_issues(result: CaseResult, issues: list[KnownIssue]) -> CaseResult:
    """FAIL/ERROR on a listed case becomes XFAIL with the listed reason; a listed case that passes says so."""
    failed = result.status in (Status.FAIL, Status.ERROR)
    issue = find(issues, result.case_id, result.reason if failed else None)
    if issue is None:
        return result
    if failed:
        result.extra["observed"] = f"{result.status.value}: {result.reason}"
        result.status, result.reason = Status.XFAIL, f"{issue.describe()}; observed {result.reason}"
    elif result.status is Status.PASS:
        result.reason = f"known issue no longer reproduces (XPASS): {issue.reason}"
        result.extra["xpass"] = True
    return result


def skipped(case, reason: str) -> CaseResult:
    result = base_result(case)
    result.status, result.reason = Status.SKIP, reason
    return result
