"""`ab`, `bisect` and `repro` on real diffusers releases from the package registry. Opt-in (`nox -s versions`, or
HARNESS_VERSIONS_TESTS=1): each release is an environment of about 1.5 GB built in one to five minutes, kept in the
environment cache ($HARNESS_ENV_CACHE, default ~/.cache/diffusers-parity-harness) for the next run. README,
"Regression across diffusers versions", has what each costs.

The facts they check (measured, CPU, torch 2.13.0): QwenImage's masked input under Ulysses is wrong up to 0.38.0
and right from 0.39.0 (#13756); training under ring 2 with `_native_flash` has wrong gradients up to 0.39.0 and is
right from 0.40.0."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.releases_repo import releases_repo
from tests.unit.versions_helpers import OPT_IN, figure_of

pytestmark = OPT_IN

MASKED = "qwenimage@masked/ulysses2/native/fp32/tensor"
RING_TRAIN = "flux/ring2/_native_flash/fp32/train"
RELEASES = ["0.36.0", "0.37.0", "0.37.1", "0.38.0", "0.39.0", "0.40.0", "0.41.0", "0.42.0", "0.42.1"]
PLAN = ["--models", "qwenimage", "--shapes", "masked", "--layouts", "ulysses2", "--backends", "native", "--dtypes",
        "fp32", "--kinds", "tensor"]


def harness(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=3600)
    print(done.stdout[-4000:], done.stderr[-2000:])
    return done


def cases(folder: Path) -> dict:
    return {case["case_id"]: case for case in json.loads((folder / "results.json").read_text())["cases"]}


def test_ab_reports_the_ulysses_mask_fix_and_the_reverse_exits_1(tmp_path):
    done = harness("ab", "--base", "diffusers==0.38.0", "--head", "diffusers==0.39.0", *PLAN,
                   "--report-dir", str(tmp_path / "ab"))
    assert done.returncode == 0, done.stderr
    assert cases(tmp_path / "ab/base")[MASKED]["status"] == "FAIL"
    assert cases(tmp_path / "ab/head")[MASKED]["status"] == "PASS"
    assert f"FAIL -> PASS  {MASKED}" in done.stdout and "(0 regressions)" in done.stdout
    reverse = harness("ab", "--base", "diffusers==0.39.0", "--head", "diffusers==0.38.0", *PLAN,
                      "--report-dir", str(tmp_path / "reverse"))
    assert reverse.returncode == 1 and f"PASS -> FAIL  {MASKED}" in reverse.stdout
    # the repro script ab wrote for the FAIL prints the matrix's figure when run alone with 0.38.0
    command = re.search(r"repro \(head\) \S+: (.+)$", reverse.stdout, re.M).group(1).split()
    script = subprocess.run(command, capture_output=True, text=True, timeout=600)
    figure = figure_of(cases(tmp_path / "reverse/head")[MASKED], "max_abs_err")
    assert f"ulysses2 (native, fp32) vs reference: max abs err {figure!r}" in script.stdout
    assert script.stdout.strip().splitlines()[-1].startswith(f"{MASKED}: FAIL (max abs err 0.0219 > tolerance")


@pytest.mark.parametrize("case, first", [(MASKED, "0.39.0"), (RING_TRAIN, "0.40.0")])
def test_bisect_over_releases_finds_the_release_that_fixed_it(tmp_path, case, first):
    done = harness("bisect", "--good", "diffusers==0.42.1", "--bad", "diffusers==0.36.0", "--case", case,
                   "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert re.search(rf"first revision that changed \({re.escape(case)} FAIL -> PASS\): diffusers {first}$",
                     done.stdout, re.M)


@pytest.mark.parametrize("case, first", [(MASKED, "0.39.0"), (RING_TRAIN, "0.40.0")])
def test_bisect_over_git_finds_the_commit_that_fixed_it(tmp_path, case, first):
    from harness.versions.envs import cache_root

    repo = releases_repo(cache_root() / "test-repos" / "diffusers-releases", RELEASES)
    done = harness("bisect", "--good", f"{repo}@v0.42.1", "--bad", f"{repo}@v0.36.0", "--case", case,
                   "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert re.search(rf"first fixed commit: [0-9a-f]+ diffusers {re.escape(first)} ", done.stdout)


def test_a_range_in_which_the_case_never_changes_is_one_clear_line(tmp_path):
    done = harness("bisect", "--good", "diffusers==0.40.0", "--bad", "diffusers==0.39.0", "--case", MASKED,
                   "--report-dir", str(tmp_path))
    assert done.returncode == 2 and "never changes" in done.stderr and len(done.stderr.strip().splitlines()) == 1
