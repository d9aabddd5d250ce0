"""The GPU check's dry run (`benchmarks/gpu/check.sh --dry-run`), run as a real process the way CI runs it: it must
plan exactly what `harness run` builds from each part's command line, check the packages against the registry,
print an estimate that fits the budget on one GPU, and refuse bad arguments, a package the registry lacks and a
budget the plan does not fit, each with a message that names the problem. Nothing here asserts on wall time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.results import CaseResult, Status
from tests.records import REAL_RUN

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "benchmarks" / "gpu" / "check.sh"
GPU_DIR = REPO / "benchmarks" / "gpu"
CLOSED_PORT = "http://127.0.0.1:9/simple"  # the discard port on loopback: nothing answers, at once


def start_dry_run(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(CHECK), "--dry-run", str(tmp_path / "out"), "--json",
                             str(tmp_path / "plan.json"), *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHON": sys.executable,
                                                                     **(env or {})})


def finish_dry_run(tmp_path: Path, started: subprocess.Popen) -> tuple[subprocess.CompletedProcess, dict | None]:
    stdout, stderr = started.communicate(timeout=600)
    plan_file = tmp_path / "plan.json"
    return (subprocess.CompletedProcess(started.args, started.returncode, stdout, stderr),
            json.loads(plan_file.read_text()) if plan_file.exists() else None)


def dry_run(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    return finish_dry_run(tmp_path, start_dry_run(tmp_path, *args, env=env))


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One dry run with the registry, shared by the tests that read it; the harness is imported here meanwhile (the
    comparison plans with it)."""
    folder = tmp_path_factory.mktemp("gpu-dry-run")
    started = start_dry_run(folder)
    import harness.cli  # noqa: F401
    import harness.run.runner  # noqa: F401

    return finish_dry_run(folder, started)


def harness_case_ids(args: list[str]) -> list[str]:
    """What `harness run ARGS` plans, through the harness's own parser, settings and planner (harness.cli.cmd_run)."""
    from harness.cli import build_parser
    from harness.run.runner import plan_from
    from harness.run.settings import OPTIONS, load_settings

    parsed = build_parser().parse_args(["run", *args])
    settings = load_settings({name: getattr(parsed, name) for name in OPTIONS if hasattr(parsed, name)}, start=REPO)
    return [planned.case.case_id for planned in plan_from(settings)]


@pytest.mark.slow
def test_dry_run_plans_what_harness_run_plans(planned, monkeypatch):
    process, plan = planned
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    monkeypatch.chdir(REPO)
    names = [part["name"] for part in plan["parts"]]
    assert names == ["single", "quick", "compile"]
    for part in plan["parts"]:
        assert f"harness run {' '.join(part['args'])}" in process.stdout  # the exact command the GPU run runs
        assert part["case_ids"] == harness_case_ids(part["args"]), part["name"]
    from harness.core.layouts import DEFAULT_LAYOUTS
    from harness.rank.backends import all_backend_names

    single, quick, compiled = plan["parts"]
    assert {case_id.split("/")[2] for case_id in single["case_ids"] if "/" in case_id} == set(all_backend_names())
    assert {case_id.split("/")[1] for case_id in single["case_ids"] if "/" in case_id} == {"single"}
    assert {case_id.split("/")[3] for case_id in single["case_ids"] if "/" in case_id} == {"bf16", "fp16"}
    assert {case_id.split("/")[4] for case_id in single["case_ids"] if "/" in case_id} == {"tensor", "train", "image"}
    assert {"wan/single/native/bf16/image", "flux/single/flex/fp16/train"} <= set(single["case_ids"])
    assert {case_id.split("/")[1] for case_id in quick["case_ids"] if "/" in case_id} >= set(DEFAULT_LAYOUTS)
    # the compile part runs the quick plan's compile slice and nothing else; the other parts run eager only
    from harness.run.settings import preset

    assert not any(case_id.endswith("/compile") for case_id in single["case_ids"] + quick["case_ids"])
    compiled_ids = sorted(case_id.removesuffix("/compile") for case_id in compiled["case_ids"])
    assert compiled_ids == sorted(preset("quick")["compile_cases"])


@pytest.mark.slow
def test_dry_run_predicts_the_gpu_and_fits_the_budget(planned):
    process, plan = planned
    assert process.returncode == 0, process.stderr[-3000:]
    single, quick, compiled = plan["parts"]
    assert single["gpu"]["RUN"] > 84  # more than on this CPU: the CUDA backends run there
    assert {"_native_cudnn", "_native_efficient", "native"} <= set(plan["usable_on_gpu"])
    assert quick["gpu"].get("ERROR", 0) > 0  # _native_flash in fp32: CUDA's flash kernel takes fp16/bf16 only
    match = re.search(r"estimate: (\d+) s of the (\d+) s budget: fits", process.stdout)
    assert match, process.stdout[-2000:]
    assert int(match[1]) <= int(match[2]) == 480
    assert plan["estimate"]["total_s"] <= 480
    assert compiled["estimate"]["compile_s"] > 0 == quick["estimate"]["compile_s"]  # compiling is counted, once
    assert [item["step"] for item in plan["estimate"]["items"]] == ["setup", "backends", "capture", "single", "quick",
                                                                     "compile", "summary"]


@pytest.mark.slow
def test_dry_run_checks_every_package_on_the_registry(planned):
    process, plan = planned
    if plan["registry_note"]:
        pytest.skip(f"the registry did not answer here: {plan['registry_note']}")
    found = {package["name"]: package for package in plan["packages"]}
    assert found["diffusers"]["wheel"].startswith("diffusers-")
    assert found["torch"]["wheel"].startswith("torch-2.13.0-cp312")  # metadata only: never downloaded
    assert found["flash-attn"]["problem"] and not found["flash-attn"]["required"]  # a source build only: SKIP there
    assert plan["problems"] == []


def test_a_package_the_registry_lacks_is_a_problem(monkeypatch):
    """What the dry run's problem list is built from (`--with NAME` puts a package there): the registry's own no."""
    monkeypatch.syspath_prepend(str(GPU_DIR))
    import dryrun
    import packages

    if not packages.reachable()[0]:
        pytest.skip("the registry did not answer here")
    missing = packages.Package("harness-gpu-check-no-such-package", "harness-gpu-check-no-such-package",
                               "asked for with --with")
    found = packages.find(missing)
    assert not found.exists and "not found on the registry" in found.problem
    _, problems = dryrun._package_rows([missing], {missing.name: found}, None)
    assert problems == [f"{missing.spec}: {found.problem}"]


@pytest.mark.slow
def test_a_budget_the_plan_does_not_fit_fails_without_the_registry(tmp_path):
    process, plan = dry_run(tmp_path, "--budget-s", "30", env={"PIP_INDEX_URL": CLOSED_PORT})
    assert process.returncode == 1
    assert "not reachable" in process.stdout  # said, and the plan still made
    assert "does NOT fit" in process.stdout and "does not fit the budget (30 s)" in process.stderr
    assert plan["parts"] and plan["estimate"]["total_s"] > 30


@pytest.mark.parametrize(("args", "message"), [
    (["--budget-s", "abc"], "--budget-s: 'abc' is not a number of seconds"),
    (["--budget-s", "-5"], "--budget-s: '-5': give a positive number of seconds"),
    (["--gpus", "0"], "--gpus: give at least 1"),
    (["--parts", "single,nope"], "--parts: unknown part(s) nope; the parts: single, quick, compile"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--prepare"], "not allowed with argument --dry-run"),
])
def test_bad_arguments_exit_2_naming_the_option(args, message):
    process = subprocess.run(["bash", str(CHECK), "--dry-run", *args], cwd=REPO, capture_output=True, text=True,
                             timeout=900, env={**os.environ, "PYTHON": sys.executable})
    assert process.returncode == 2, process.stdout + process.stderr
    assert message in process.stderr


def test_the_registry_path_takes_the_torch_of_every_cpu_figure(monkeypatch):
    """The GPU run's fallback torch is the version the CPU runs use (noxfile, scripts/setup.sh): one fact, kept
    equal."""
    monkeypatch.syspath_prepend(str(GPU_DIR))
    import packages

    assert f'"HARNESS_TORCH", "{packages.TORCH}"' in (REPO / "noxfile.py").read_text()
    assert f"\nTORCH={packages.TORCH}\n" in (REPO / "scripts" / "setup.sh").read_text()  # .ci/run's and the README's


def test_part_names_are_the_parts(monkeypatch):
    monkeypatch.syspath_prepend(str(GPU_DIR))
    import plan

    assert tuple(part.name for part in plan.parts(1)) == plan.PART_NAMES


@pytest.mark.skipif(bool(__import__("shutil").which("nvidia-smi")), reason="a GPU machine would run the check itself")
def test_the_gpu_run_refuses_a_machine_without_a_gpu(tmp_path):
    """Without --dry-run on a CPU machine: exit 3 with the reason, a summary all the same, nothing installed."""
    process = subprocess.run(["bash", str(CHECK), str(tmp_path / "out"), "--work", str(tmp_path / "work")], cwd=REPO,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHON": sys.executable})
    assert process.returncode == 3, process.stdout + process.stderr
    assert "no NVIDIA GPU here" in process.stdout
    assert "Exit 3: this machine could not run the check" in (tmp_path / "out" / "summary.md").read_text()
    assert not (tmp_path / "work").exists()


def test_the_summary_reports_a_part_cut_short(tmp_path, monkeypatch):
    """A part stopped at its deadline leaves only results.partial.jsonl: the summary still shows its cases."""
    monkeypatch.syspath_prepend(str(GPU_DIR))
    import summary

    part = tmp_path / "single"
    part.mkdir()
    case = CaseResult("flux/single/_native_cudnn/bf16/tensor", "flux", "default", "tensor", "single", 1,
                      "_native_cudnn", "bf16", Status.FAIL, reason="max abs err 0.4 > tolerance 0.15", seconds=0.2,
                      peak_mem_mb=12.5)
    lines = [json.dumps({"fingerprint": "x"}), json.dumps(case.to_dict()), '{"case_id": "torn']
    (part / "results.partial.jsonl").write_text("\n".join(lines))
    steps = [{"name": "single", "status": "timeout", "rc": 124, "seconds": 240.0, "timeout_s": 240.0,
              "detail": "did not finish within its 240 s",
              "extra": {"title": "one GPU", "args": ["--layouts", "single"]}}]
    text = summary.write(tmp_path, steps, {"exit_code": 1, "budget_s": 480.0, "wall_s": 470.0}).read_text()
    assert "Cut short" in text and "**1 FAIL**" in text
    assert "| 1 | FAIL | max abs err 0.4 > tolerance 0.15 | `flux/single/_native_cudnn/bf16/tensor` |" in text
    assert "| flux | tensor | 12.5 |" in text
    assert json.loads((tmp_path / "summary.json").read_text())["steps"][0]["status"] == "timeout"


def test_the_summary_reads_a_parts_results_as_harness_run_wrote_them(tmp_path, monkeypatch):
    """A real run's results.json: its cases by backend and by layout, its header's counts and time breakdown."""
    monkeypatch.syspath_prepend(str(GPU_DIR))
    import summary

    (tmp_path / "multi").mkdir()
    (tmp_path / "multi" / "results.json").write_text(REAL_RUN.read_text())
    steps = [{"name": "multi", "status": "ok", "rc": 0, "seconds": 84.0, "timeout_s": 240.0, "detail": "",
              "extra": {"title": "two GPUs", "args": ["--layouts", "single,ulysses2,tp2"]}}]
    text = summary.write(tmp_path, steps, {"exit_code": 0, "budget_s": 480.0, "wall_s": 90.0}).read_text()
    assert "**8 PASS** (8 cases; exit 0, ok)" in text
    assert "| native | 3 PASS | 3 PASS | 1 PASS | 1 PASS |" in text  # tensor bf16, tensor fp32, train bf16, train fp32
    assert "| ulysses2 | 2 | 4 |" in text and "| floor |" in text
    part = json.loads((tmp_path / "summary.json").read_text())["parts"]["multi"]
    assert part["counts"]["PASS"] == 8 and part["time_breakdown"]["floor"] > 0
