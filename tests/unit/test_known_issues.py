"""Known-issue entries across diffusers releases: alternative error texts, version ranges, and bad entries."""

from pathlib import Path

import pytest

from harness.core import compat
from harness.core.errors import HarnessError
from harness.core.results import CaseResult, Status
from harness.run.known_issues import KnownIssue, find, load_known_issues
from harness.run.verdict import apply_known_issues, base_result

REPOSITORY_FILE = Path(__file__).resolve().parents[2] / "known_issues.toml"
OLD_FLASH = "ValueError: `attn_mask` is not supported for aiter attention"
NEW_FLASH = "ValueError: `attn_mask` is not supported for native flash attention"


def test_any_of_a_list_of_texts_matches():
    issue = KnownIssue("*@masked/*/_native_flash/*/*", "no mask", error_contains=("native flash", "aiter attention"))
    case_id = "qwenimage@masked/ulysses2/_native_flash/bf16/tensor"
    assert issue.applies(case_id, NEW_FLASH)
    assert issue.applies(case_id, OLD_FLASH)
    assert not issue.applies(case_id, "RuntimeError: something else")


def test_a_version_range_limits_the_entry_to_its_releases():
    issue = KnownIssue("*", "old wording", error_contains="aiter attention", diffusers=">=0.37,<0.40")
    assert issue.applies("x", OLD_FLASH, version="0.38.0")
    assert not issue.applies("x", OLD_FLASH, version="0.40.0")
    assert not issue.applies("x", OLD_FLASH, version="0.36.0")
    assert KnownIssue("*", "r", diffusers="<0.44").covers("0.43.0.dev0")  # a source install of main counts


def test_an_entry_outside_its_range_reports_no_xpass():
    issue = KnownIssue("*", "fixed in 0.39", diffusers="<0.39")
    assert find([issue], "flux/ulysses2/native/fp32/tensor", None, version="0.38.0") is issue
    assert find([issue], "flux/ulysses2/native/fp32/tensor", None, version="0.42.1") is None


def test_the_range_is_checked_against_the_installed_diffusers(monkeypatch):
    issue = KnownIssue("*", "old release only", error_contains="boom", diffusers="<0.39")
    failing = base_result(_case())
    failing.status, failing.reason = Status.ERROR, "ValueError: boom"
    monkeypatch.setattr(compat, "installed_version", lambda: "0.42.1")
    assert apply_known_issues(failing, [issue]).status is Status.ERROR
    monkeypatch.setattr(compat, "installed_version", lambda: "0.38.0")
    assert apply_known_issues(failing, [issue]).status is Status.XFAIL


def test_load_lists_and_ranges(tmp_path):
    path = tmp_path / "known.toml"
    path.write_text('[[issue]]\nmatch = "*"\nreason = "r"\nerror_contains = ["a", "b"]\ndiffusers = ">=0.37"\n')
    (issue,) = load_known_issues(path)
    assert issue.error_contains == ("a", "b") and issue.diffusers == ">=0.37"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('diffusers = "0.38 or later"', r"'diffusers' = '0.38 or later' is not a version range"),
        ("error_contains = 3", "'error_contains' must be a string or a list of strings, not int"),
        ("error_contains = []", "'error_contains' must be a string or a non-empty list"),
        ('error_contains = ["a", ""]', "'error_contains' must be a string or a non-empty list of non-empty"),
        ("diffusers = 0.38", "'diffusers' must be a string"),
        ('version = ">=0.38"', r"unknown keys \['version'\]; valid keys: diffusers, error_contains, link, match"),
    ],
)
def test_a_bad_entry_names_the_file_and_the_entry(tmp_path, body, message):
    path = tmp_path / "known.toml"
    given = "" if body.startswith("error_contains") else 'error_contains = "boom"\n'
    path.write_text(f'[[issue]]\nmatch = "a"\nreason = "r"\nerror_contains = "x"\n\n[[issue]]\nmatch = "flux/*"\n'
                    f'reason = "r"\n{given}{body}\n')
    with pytest.raises(HarnessError, match=message) as raised:
        load_known_issues(path)
    assert f"{path}: [[issue]] #2 ('flux/*')" in str(raised.value)


def test_repository_native_flash_mask_entry_knows_each_release_wording():
    issues = load_known_issues(REPOSITORY_FILE)
    case_id = "qwenimage@masked/ulysses2/_native_flash/bf16/tensor"
    assert find(issues, case_id, OLD_FLASH, version="0.38.0") is not None
    assert find(issues, case_id, NEW_FLASH, version="0.42.1") is not None
    assert find(issues, case_id, "RuntimeError: other", version="0.42.1") is None


def _case():
    from harness.core.layouts import parse_layout
    from harness.core.records import Case

    return Case("flux", parse_layout("ulysses2"), "native", "fp32")


def test_an_entry_is_evidence_not_a_blanket(tmp_path):
    """A numerical entry pins the status and the measured band; an entry without the expected text is refused."""
    path = tmp_path / "known.toml"
    path.write_text('[[issue]]\nmatch = "helios_amplify/*"\nerror_contains = "max abs err"\nstatus = "FAIL"\n'
                    'max_abs_err = [0.15, 0.45]\nreason = "history scaled on the wrong tokens"\n')
    (issue,) = load_known_issues(path)
    message = "max abs err 0.31 > tolerance 1e-05"
    assert issue.applies("helios_amplify/ulysses2/native/fp32/tensor", message, status="FAIL", max_abs_err=0.31)
    assert not issue.applies("helios_amplify/ulysses2/native/fp32/tensor", "max abs err 0.9 > tolerance 1e-05",
                             status="FAIL", max_abs_err=0.9)  # another size: another bug
    assert not issue.applies("helios_amplify/ulysses2/native/fp32/tensor", message, status="ERROR", max_abs_err=0.31)
    path.write_text('[[issue]]\nmatch = "ltx2/*"\nreason = "anything goes"\n')
    with pytest.raises(HarnessError, match="needs 'error_contains'"):
        load_known_issues(path)
    path.write_text('[[issue]]\nmatch = "x/*"\nerror_contains = "err"\nreason = "r"\nmax_abs_err = [0.4, 0.2]\n'
                    'status = "FAIL"\n')
    with pytest.raises(HarnessError, match="must be the measured band"):
        load_known_issues(path)


def test_a_proof_failure_never_becomes_xfail():
    """A redirected dispatch on a model with a numerical known issue stays FAIL (its numbers are not the case's)."""
    issue = KnownIssue("helios_amplify/*", "history", error_contains="max abs err", status="FAIL",
                       max_abs_err=(0.15, 0.45))
    result = base_result(_case())
    result.status, result.max_abs_err = Status.FAIL, 0.31
    result.reason = "requested _native_math, dispatched native:2; numbers: max abs err 0.31 > tolerance 1e-05"
    result.extra["proof_failure"] = True
    result = CaseResult(**{**result.__dict__, "case_id": "helios_amplify/ulysses2/_native_math/fp32/tensor"})
    assert apply_known_issues(result, [issue]).status is Status.FAIL
