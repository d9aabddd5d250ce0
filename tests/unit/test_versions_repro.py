"""`harness repro`: the script is standalone (no harness import), says no clearly to what it cannot script, and, run
alone under torchrun, prints the figure the matrix shows for the same case."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.errors import HarnessError
from harness.versions import repro
from harness.versions.cases import as_flags, plan_options
from tests.unit.versions_helpers import OPT_IN, figure_of

ROOT = Path(__file__).resolve().parents[2]
MASKED = "qwenimage@masked/ulysses2/native/fp32/tensor"


def imported(text: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("case_id", [MASKED, "flux/ring4/_native_flash/fp32/train"])
def test_the_script_imports_torch_and_diffusers_only(tmp_path, case_id):
    out, command = repro.write_repro(case_id, tmp_path / "repro.py")
    text = out.read_text()
    assert imported(text) - set(sys.stdlib_module_names) == {"torch", "diffusers", "safetensors"}
    assert f"CASE = {{'id': '{case_id}'" in text and command.endswith(str(out))
    template = (Path(repro.SCRIPTS) / "train.py").read_text()
    assert "harness" in imported(template)  # negative control: the templates do import it, above the marker


@pytest.mark.parametrize("case_id, said", [
    ("flux/ulysses2/native/fp32/image", "image cases are not scripted"),
    ("flux/dp2/native/fp32/train", "under tensor or data parallelism is not scripted"),
    ("flux/tcp2/native/fp32/tensor", "PyTorch's context parallelism is not scripted"),
    ("flux/tcp2/native/fp32/train", "PyTorch's context parallelism is not scripted"),
    ("flux@masked/ulysses2/native/fp32/tensor", "is not in the plan"),
    ("flux/ulysses2/native/fp32/tensor+cp_local_attention", "is not of the form"),
    ("flux/ulysses2/native/fp32/tensor/aot_eager", "a compiled case is not scripted"),
])
def test_what_cannot_be_scripted_is_one_clear_line(tmp_path, case_id, said):
    with pytest.raises(HarnessError, match=said.replace("+", r"\+")) as caught:
        repro.write_repro(case_id, tmp_path / "repro.py")
    assert "\n" not in str(caught.value) and not (tmp_path / "repro.py").exists()


def matrix_and_script(tmp_path: Path, case_id: str, world_size: int) -> tuple[dict, str]:
    """The case's row from `harness run`, and what its script printed run alone under torchrun."""
    flags = as_flags(plan_options([case_id]))
    subprocess.run([sys.executable, "-m", "harness", "run", *flags, f"--report-dir={tmp_path / 'run'}"], cwd=ROOT,
                   capture_output=True, timeout=600)
    row = next(case for case in json.loads((tmp_path / "run/results.json").read_text())["cases"]
               if case["case_id"] == case_id)
    out, _ = repro.write_repro(case_id, tmp_path / "repro.py")
    return row, alone([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
                       str(out)])


def alone(command: list[str]) -> str:
    """Run the script in a session of its own; its whole group is killed if it outlives the test."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"}) as process:
        try:
            return process.communicate(timeout=600)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_tensor_script_prints_the_matrix_figure(tmp_path):
    row, printed = matrix_and_script(tmp_path, MASKED, 2)
    figure = figure_of(row, "max_abs_err")
    assert row["status"] == "PASS" and 0 < figure < 1e-5  # a real figure, not a zero that matches
    assert f"ulysses2 (native, fp32) vs reference: max abs err {figure!r}" in printed
    assert printed.strip().endswith(f"{MASKED}: PASS")


@pytest.mark.parametrize("opt_in", [pytest.param(None, marks=OPT_IN)])
def test_a_train_script_prints_the_matrix_figure_of_a_finding(tmp_path, opt_in):
    """The ring-4 backward of diffusers 0.42.1 (a finding of the full plan, XFAIL by its known issue)."""
    case_id = "flux/ring4/_native_flash/fp32/train"
    row, printed = matrix_and_script(tmp_path, case_id, 4)
    figure = figure_of(row, "grad_err")
    assert row["status"] == "XFAIL" and figure > 1e-3
    assert f"step-1 gradients rel L2 err (all parameters) {figure!r}" in printed
    assert printed.strip().splitlines()[-1].startswith(f"{case_id}: FAIL (loss rel err")


PROCESSOR_AFTER = "flux/ulysses2/native/fp32/tensor/processor_after"


@pytest.mark.parametrize("case_id, call, more", [(PROCESSOR_AFTER, "processor", set()),
                                                 ("flux/tp2/native/fp32/tensor/add_adapter_after", "add_adapter",
                                                  {"peft"})])
def test_a_flow_case_carries_the_flows_own_code_and_no_harness(tmp_path, case_id, call, more):
    out, _ = repro.write_repro(case_id, tmp_path / "repro.py")
    text = out.read_text()
    assert imported(text) - set(sys.stdlib_module_names) == {"torch", "diffusers", "safetensors", *more}
    assert f"def {call}(module, setting):" in text and f"    for _ in {call}(module, Setting(*setting)) or ():" in text
    assert "'position': 'after'" in text
    plain, _ = repro.write_repro(case_id.rpartition("/")[0], tmp_path / "plain.py")  # negative control
    assert "def FLOW(" not in plain.read_text() and "'flow': None" in plain.read_text()


@pytest.mark.slow
def test_a_flow_script_prints_the_matrix_figure_of_a_finding(tmp_path):
    """set_attn_processor after context parallelism (a finding of 0.42.1, XFAIL by its known issue, which names the
    failed proof exactly): the script makes the flow's calls and is judged against one device making them, as the
    harness is, and fails as the case's unexcused verdict did."""
    row, printed = matrix_and_script(tmp_path, PROCESSOR_AFTER, 2)
    figure = figure_of(row, "max_abs_err")
    observed = row["reason"].split("; observed ")[1]  # what the entry excused: the failed proof, then the figure
    assert row["status"] == "XFAIL" and observed.startswith("communication: ") and "max abs err" in observed
    assert figure > 1e-3
    assert f"ulysses2 (native, fp32) vs reference: max abs err {figure!r}" in printed
    assert printed.strip().splitlines()[-1].startswith(f"{PROCESSOR_AFTER}: FAIL (max abs err")
