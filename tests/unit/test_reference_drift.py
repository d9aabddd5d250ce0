"""What a case shows of its reference's one-device run (harness.run.reference_drift): a figure of its own, never a
failed check; the run's summary and the page's banner say each moved reference once with its first module; a FAIL
whose one device moved too names that module in its first divergence."""

from __future__ import annotations

from harness.core.figures import REFERENCE, with_role
from harness.core.records import Localization, ModuleTrace
from harness.core.results import CaseResult, Status
from harness.report.matrix import WIDTH
from harness.report.moved import moved_banner
from harness.run import reference_drift
from harness.run.divergence import first_divergence

MOVED = {"line": "transformer_blocks.0.attn.norm_q: rel err 1.7e-06 > 1.0e-14 (previous 0.0e+00)", "value": 1.7e-6,
         "limit": 1e-14, "derived": "its own noise: captured on this platform", "forward": {"modules": [], "first": 0}}
STILL = {**MOVED, "line": "none: every module within its limit", "value": 0.0}


def _case(layout: str = "ulysses2", drift: dict | None = None, status: Status = Status.PASS) -> CaseResult:
    result = CaseResult(f"flux/{layout}/native/fp32/tensor", "flux", "default", "tensor", layout,
                        1 if layout == "single" else 2, "native", "fp32", status)
    reference_drift.judge(result, {"drift": drift})
    return result


def test_a_moved_reference_is_a_figure_of_its_own_and_fails_nothing():
    result = _case(drift=MOVED)
    figure = with_role(result.figures, REFERENCE)
    assert (figure["value"], figure["limit"]) == (1.7e-6, 1e-14) and "short" not in figure  # not a check
    assert result.extra["drift"] is MOVED and reference_drift.moved(result) == MOVED["line"]
    assert reference_drift.moved(_case(drift=STILL)) is None
    assert _case(drift=None).figures == []


def test_the_summary_and_the_page_say_each_moved_reference_once():
    cases = [_case("single", MOVED), _case("ulysses2", MOVED), _case("tp2", STILL)]
    lines = reference_drift.summary_lines(cases)
    assert all(len(part) <= WIDTH for line in lines for part in line.splitlines())  # wrapped as wide as the matrix
    lines = [line.replace("\n  ", " ") for line in lines]
    assert lines == [f"one device moved off its stored reference: flux@default tensor: rel err 1.7e-06 > 1e-14 (its "
                     f"own noise: captured on this platform); first moved: {MOVED['line']}"]
    banner = moved_banner(cases)
    assert banner.count("<li>") == 1 and 'href="#case-flux/single/native/fp32/tensor"' in banner
    assert moved_banner([_case("tp2", STILL)]) == ""
    absent = _case(drift={"absent": "references/flux/tensor.safetensors predates per-module fingerprints"})
    assert [line.replace("\n  ", " ") for line in reference_drift.summary_lines([absent])] == [
        "note: 1 reference(s) hold no module fingerprints (flux@default): where one device leaves them cannot be "
        "located"]


def test_a_failure_one_device_shares_names_where_one_device_first_left_the_reference():
    from harness.core.evidence import Evidence
    from harness.core.figures import SINGLE_DEVICE, FigureSpec

    result = _case(drift=MOVED, status=Status.FAIL)
    result.evidence = [Evidence("max_abs_err", "max abs err 0.0185 > tolerance 1e-05", value=0.0185,
                                limit=1e-5).to_dict()]
    result.figures.append(FigureSpec("single_max_abs_err", "max abs err of the single-device run (same dtype)",
                                     role=SINGLE_DEVICE).of(0.0185, 1e-5))
    found = Localization(ModuleTrace([], None, None), summary="none: every module within its limit")
    assert first_divergence(result, found).endswith(f"not the parallelism; first off the stored reference: "
                                                    f"{MOVED['line']}")
    result.extra["drift"] = {"absent": "x predates per-module fingerprints"}
    assert "the reference holds the final output only" in first_divergence(result, found)


def test_ab_and_bisect_name_the_first_module_that_moved_between_two_revisions():
    """The head runs against the base's references: its one device leaving them, inside the tolerance (its single
    case still PASS), is said with the module; a head on them says nothing more (negative control)."""
    from harness.versions.ab_report import single_device
    from harness.versions.search import Step, _moved

    base = [_case("single", STILL)]
    verdict = single_device(base, [_case("single", MOVED), _case("ulysses2", MOVED)])["verdict"]
    assert verdict == f"unchanged; moved off the base's references: flux@default tensor first at {MOVED['line']}"
    assert single_device(base, [_case("single", STILL)])["verdict"] == "unchanged"
    step = Step("diffusers 0.42.1", {"flux/single/native/fp32/tensor": _case("single", MOVED)})
    assert _moved(step) == [f"  diffusers 0.42.1: flux/single/native/fp32/tensor: one device first left the stored "
                            f"reference at {MOVED['line']} (limit: {MOVED['derived']})"]
