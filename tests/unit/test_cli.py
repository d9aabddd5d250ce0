"""`harness` as a user runs it: a real subprocess, real torchrun, files on disk."""

import subprocess
import sys

import pandas as pd
import pytest

CONTRACT_COLUMNS = ["case_id", "model", "kind", "layout", "world_size", "backend", "dtype", "status", "max_abs_err",
                    "mean_abs_err", "reason", "seconds"]


def harness(*args, cwd):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_run_writes_the_matrix_and_captures_missing_references(project, monkeypatch):
    monkeypatch.setenv("HARNESS_TIME_LOG", str(project / "time.jsonl"))  # benchmarks/bench_tests.py reads it
    done = harness("run", "--models", "flux", "--layouts", "ulysses2,ring2,tp2", "--backends", "native,_native_flash,"
                   "_native_math", "--dtypes", "fp32", "--kinds", "tensor", cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr  # ring2/native is an ERROR: no known-issues file here
    assert "capturing 1 missing reference(s) first: flux@default/tensor" in done.stdout
    assert (project / "references/flux/tensor.safetensors").exists()
    frame = pd.read_csv(project / "reports/matrix.csv", keep_default_na=False)  # pandas reads "N/A" as NaN
    assert set(CONTRACT_COLUMNS) <= set(frame.columns)
    status = dict(zip(frame.case_id, frame.status, strict=False))
    assert status["flux/ulysses2/native/fp32/tensor"] == "PASS"
    assert status["flux/ring2/_native_flash/fp32/tensor"] == "PASS"
    assert status["flux/ring2/native/fp32/tensor"] == "ERROR"
    assert status["flux/ulysses2/_native_math/fp32/tensor"] == "N/A"  # not registered as context-parallel capable
    reasons = dict(zip(frame.case_id, frame.reason, strict=False))
    assert "return_lse" in reasons["flux/ring2/native/fp32/tensor"]
    assert "| `flux/ring2/native/fp32/tensor` | **ERROR** | " in (project / "reports/matrix.md").read_text()
    assert "experimental" not in done.stdout + done.stderr  # diffusers' warnings stay out of the user's terminal
    import json

    breakdown = json.loads((project / "reports/results.json").read_text())["header"]["time_breakdown"]
    assert breakdown["launch start-ups"] > 0 and breakdown["forward"] > 0 and breakdown["reports"] > 0
    assert breakdown["floor"] <= breakdown["wall"] and breakdown["ratio to floor"] >= 1
    assert any(line.startswith("time: ") and "floor" in line for line in done.stdout.splitlines())
    logged = [json.loads(line) for line in (project / "time.jsonl").read_text().splitlines()]
    assert logged == [{"launches": 1, "time_breakdown": breakdown}]  # one run, one world size, the header's figures


@pytest.mark.slow
def test_known_issue_makes_it_xfail_and_exit_zero(project):
    (project / "known_issues.toml").write_text(
        '[[issue]]\nmatch = "*/ring*/native/*/*"\nerror_contains = "return_lse"\nreason = "no LSE"\n')
    done = harness("run", "--models", "flux", "--layouts", "ring2", "--backends", "native", "--dtypes", "fp32",
                   "--kinds", "tensor", cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    frame = pd.read_csv(project / "reports/matrix.csv", keep_default_na=False)
    assert frame.status.tolist() == ["XFAIL"]
    assert "known issue: no LSE" in frame.reason[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--layouts", "ulyses2"], "unknown layout 'ulyses2'"),
        (["run", "--models", "sd3"], "unknown model 'sd3'; valid models:"),
        (["run", "--dtypes", "fp8"], "unknown dtype 'fp8'"),
        (["run", "--backends", "fast"], "unknown backend 'fast'"),
    ],
)
def test_bad_names_are_rejected_before_anything_launches(project, args, message):
    done = harness(*args, cwd=project)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (project / "reports").exists()


@pytest.mark.slow  # a full plan's worth of records, or every model captured
def test_capture_keeps_existing_unless_forced(project, rewrite_meta):
    first = harness("capture", "--models", "qwenimage", cwd=project)
    assert "captured" in first.stdout, first.stderr
    path = project / "references/qwenimage/tensor.safetensors"
    stamp = path.stat().st_mtime_ns
    assert "kept" in harness("capture", "--models", "qwenimage", cwd=project).stdout
    assert path.stat().st_mtime_ns == stamp
    forced = harness("capture", "--models", "qwenimage", "--force", cwd=project).stdout
    assert f"kept     {path} (the recapture reproduces it)" in forced and path.stat().st_mtime_ns == stamp
    rewrite_meta(path, lambda meta: meta.update(torch="0.0.1-old"))  # a reference of another torch
    assert f"captured {path}" in harness("capture", "--models", "qwenimage", "--force", cwd=project).stdout


@pytest.mark.slow
def test_a_run_where_no_parallel_case_ran_exits_1_unless_asked(project, zoo_references):
    """On a host too small for every parallel layout, a green run would say nothing about parallel parity."""
    args = ["run", "--references", str(zoo_references), "--models", "flux", "--layouts", "single,ulysses2",
            "--backends", "native", "--dtypes", "fp32", "--kinds", "tensor", "--modes", "eager", "--loads", "enable",
            "--flows", "none", "--cpu-max-ranks", "1"]
    done = harness(*args, cwd=project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "WARNING: no case with more than one rank ran" in done.stdout
    assert "1 PASS, 1 SKIP" in done.stdout
    allowed = harness(*args, "--allow-no-parallel", cwd=project)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "WARNING" not in allowed.stdout
