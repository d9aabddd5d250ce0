"""The pytest plugin as a user runs it: missing reference -> error -> `pytest --ref` -> compare passes."""

import pytest

from harness.plugin import check_parity

pytest_plugins = ["pytester"]

# What a user's project writes: the plugin supplies the cases, the shared run and each outcome.
PARITY_TESTS = '''
from harness.plugin import check_parity, check_reference


def test_reference(captured_reference):
    check_reference(captured_reference)


def test_parity(parity_case, parity_results):
    check_parity(parity_case, parity_results)
'''


@pytest.fixture
def user_project(pytester):
    pytester.makefile(".toml", pyproject='[tool.harness]\nmodels = ["flux"]\nlayouts = ["ulysses2", "ulysses4"]\n'
                      'backends = ["native"]\ndtypes = ["fp32"]\nkinds = ["tensor"]\nmodes = ["eager"]\n'
                      'loads = ["enable"]\nflows = ["none"]\n'
                      'cpu_max_ranks = 2\n')
    pytester.makepyfile(test_matrix=PARITY_TESTS)
    return pytester


@pytest.mark.slow
def test_reference_lifecycle(user_project):
    missing = user_project.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    missing.assert_outcomes(failed=1, skipped=1, deselected=1)  # ulysses4 is SKIP (2 ranks allowed); no --ref
    missing.stdout.fnmatch_lines(["*missing reference*run `pytest --ref` or `harness capture`*"])

    from harness.catalogue.zoo import get_spec

    captured = user_project.runpytest_subprocess("-q", "--ref")
    captured.assert_outcomes(passed=len(get_spec("flux").shapes), deselected=1)  # one reference per shape
    assert (user_project.path / "references/flux/tensor.safetensors").exists()
    captured.stdout.fnmatch_lines(["*= references =*", f"captured ({len(get_spec('flux').shapes)}): *"])
    path = user_project.path / "references/flux/tensor.safetensors"
    before = path.read_bytes()
    again = user_project.runpytest_subprocess("-q", "--ref", "--ref-force")
    again.stdout.fnmatch_lines(["kept: the recapture reproduces it (*"])
    assert path.read_bytes() == before  # git would see no change

    compared = user_project.runpytest_subprocess("-q", "-rs")
    compared.assert_outcomes(passed=1, skipped=1, deselected=1)
    compared.stdout.fnmatch_lines(["*needs 4 ranks*"])
    assert (user_project.path / "reports.work/pytest/results.json").exists()  # pytest's own, not in reports/


def test_the_warm_parent_starts_before_collection_imports_torch(user_project):
    """As `harness run` does: its imports overlap those of planning the parity items (3 s of a 17 s session)."""
    user_project.makepyfile(probe='''
import os, sys
from harness.run import warm

def early(settings):
    with open("early.txt", "w") as said:
        said.write("torch " + ("imported" if "torch" in sys.modules else "not imported") + " yet")
    os._exit(0)

warm.start_early = early
''')
    user_project.runpytest_subprocess("--collect-only", "-q", "-p", "probe")
    assert (user_project.path / "early.txt").read_text() == "torch not imported yet"


@pytest.mark.slow
def test_test_ids_are_case_ids(user_project):
    collected = user_project.runpytest_subprocess("--collect-only", "-q")
    collected.stdout.fnmatch_lines(["*test_parity[[]flux/ulysses2/native/fp32/tensor[]]*"])


@pytest.mark.slow
def test_harness_options_override_pyproject(user_project):
    collected = user_project.runpytest_subprocess("--collect-only", "-q", "--harness-layouts", "tp2")
    collected.stdout.fnmatch_lines(["*test_parity[[]flux/tp2/native/fp32/tensor[]]*"])
    assert "ulysses2" not in collected.stdout.str()


@pytest.mark.slow
def test_a_failing_train_case_is_its_failure_with_the_command_that_reruns_it(pytester):
    """A train case has no mean abs error: its item fails with its own figures and reason (not a TypeError), and the
    rerun line names its kind and shape, so it reruns that case alone. Without the known-issue file, flux under tp2
    trains the per-head norm weights wrong (README, training findings): a real FAIL."""
    from pathlib import Path

    references = Path(__file__).resolve().parents[2] / "references"
    pytester.makefile(".toml", pyproject=f'[tool.harness]\nmodels = ["flux"]\nlayouts = ["tp2"]\n'
                      f'backends = ["native"]\ndtypes = ["fp32"]\nkinds = ["train"]\ncpu_max_ranks = 2\n'
                      f'loads = ["enable"]\nflows = ["none"]\nknown_issues = "none.toml"\n'
                      f'references = "{references}"\n')
    pytester.makepyfile(test_matrix=PARITY_TESTS)
    ran = pytester.runpytest_subprocess("-q", "-k", "test_parity")
    ran.assert_outcomes(failed=1)
    output = ran.stdout.str()
    assert "TypeError" not in output
    ran.stdout.fnmatch_lines(["*flux/tp2/native/fp32/train: FAIL loss_err=* (limit 1e-05) weight_max_abs_err=* "
                              "(limit 0.001)*: the ranks disagree on *",
                              "*rerun alone: harness run --models flux --shapes default --layouts tp2 --backends "
                              "native --dtypes fp32 --kinds train"])


def test_pytest_help_in_the_environment_imports_no_torch(tmp_path):
    """The plugin is registered in every pytest session of the environment: reading its options (`pytest --help`)
    must not import torch or diffusers (seconds, and a CUDA initialisation on a GPU machine)."""
    import subprocess
    import sys

    probe = ("import contextlib, io, sys, pytest\n"
             "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
             "    pytest.main(['--help', '-p', 'no:cacheprovider'])\n"
             "assert '--harness-layouts' in out.getvalue(), 'the plugin did not register its options'\n"
             "print(sorted(name for name in ('torch', 'diffusers') if name in sys.modules))\n")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]", ran.stdout


def test_a_not_applicable_case_is_a_pytest_skip_that_says_so():
    """pytest has no outcome for a combination that cannot exist: N/A is a skip whose reason starts with "not
    applicable: " (`-rs` lists it so); a SKIP's reason is left as it is (the negative control)."""
    from harness.core.applicability import NotApplicable
    from harness.core.layouts import parse_layout
    from harness.core.records import Case
    from harness.core.results import CaseResult, Status
    from harness.plugin import ParityResults
    from harness.run.plan import PlannedCase

    case = Case("flux", parse_layout("ulysses2"), "_native_math", "fp32")
    refused = "diffusers does not register backend '_native_math' as context-parallel capable"
    for reason, said in ((NotApplicable(refused), f"not applicable: {refused}"), ("needs 4 ranks", "needs 4 ranks")):
        with pytest.raises(pytest.skip.Exception) as skipped:
            check_parity(PlannedCase(case, reason), ParityResults())
        assert skipped.value.msg == said
    result = CaseResult(case.case_id, world_size=2, **case.axis_values(), status=Status.NOT_APPLICABLE, reason=refused)
    with pytest.raises(pytest.skip.Exception, match="^not applicable: diffusers does not"):  # read back from a run
        check_parity(PlannedCase(case), ParityResults({case.case_id: result}))
