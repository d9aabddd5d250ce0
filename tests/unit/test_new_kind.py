"""Adding a kind, or a figure to a kind, is one module of your own: planned, run, judged and rendered in every view
with no other file touched (harness/kinds/__init__.py: `HARNESS_KINDS`)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

TOY = '''
"""A toy kind: one forward, judged only by the ratio of the output's norm to the reference's."""

from harness.core.evidence import Evidence
from harness.core.figures import FigureSpec
from harness.core.options import Option
from harness.kinds import Check, register
from harness.kinds.tensor import TensorKind

NORM = FigureSpec("norm_ratio", "output norm / reference norm", ".9f", cell="n{value:.4f}")


class NormKind(TensorKind):
    name = "norm"
    help = "the ratio of the output's norm to the reference's"
    checks = {"norm_ratio": Check()}
    figures = (NORM,)
    options = (Option("slack", 1e-3, "How far the norm ratio may be from 1."),)
    limits = None

    def policy(self, settings, dtype):
        return settings.of(self.name, "slack")

    def measure(self, output, reference, baseline, case, images_dir, draws=None):
        return {"norm_ratio": float(output.double().norm() / reference.output.double().norm())}

    def judge(self, result, metrics, slack):
        ratio = metrics["norm_ratio"]
        result.figures = [NORM.of(ratio, slack)]
        if abs(ratio - 1) <= slack:
            return []
        return [Evidence("norm_ratio", f"norm ratio {ratio:.9f} is off 1 by more than {slack:g}", value=ratio,
                         limit=slack)]

    def rank_tolerance(self, slack):
        return 1e-5


register(NormKind())
'''

EXTRA = '''
"""A new figure on an existing kind: the tensor kind's mean error over its max, beside its own figures."""

from harness.core.figures import FigureSpec
from harness.kinds import kind_of

SHARE = FigureSpec("mean_to_max", "mean abs err / max abs err")
tensor = kind_of("tensor")
judge = type(tensor).judge


def with_share(self, result, metrics, policy):
    found = judge(self, result, metrics, policy)
    result.figures.append(SHARE.of(metrics["mean_abs_err"] / max(metrics["max_abs_err"], 1e-30), 1.0))
    return found


type(tensor).judge = with_share
'''


@pytest.fixture
def own_kinds(project, monkeypatch):
    (project / "toy_kind.py").write_text(TOY)
    (project / "extra_figure.py").write_text(EXTRA)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HARNESS_KINDS", "toy_kind,extra_figure")
    return project


def harness(project, *args):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=project, capture_output=True, text=True,
                          timeout=600)


def rows(report_dir):
    with open(report_dir / "matrix.csv") as handle:
        return {row["case_id"]: row for row in csv.DictReader(handle)}


def test_a_kind_of_your_own_is_planned_run_judged_and_rendered(own_kinds):
    # eager only, no load and no flow, as the `project` fixture's file says: this is a test of kinds, not of the slices
    (own_kinds / "pyproject.toml").write_text('[tool.harness]\nmodes = ["eager"]\nloads = ["enable"]\n'
                                               'flows = ["none"]\n'
                                               '[tool.harness.norm]\nslack = 1e-3\n')
    plan = ("--models", "flux", "--layouts", "single,ulysses2", "--backends", "native", "--dtypes", "fp32",
            "--kinds", "norm,tensor")
    done = harness(own_kinds, "run", *plan, "--report-dir", "clean")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS n1.0000" in done.stdout  # the terminal's cell is the toy kind's key figure
    found = rows(own_kinds / "clean")
    assert abs(float(found["flux/ulysses2/native/fp32/norm"]["norm_ratio"]) - 1) < 1e-3
    assert float(found["flux/ulysses2/native/fp32/tensor"]["mean_to_max"]) < 1  # the figure added to tensor
    assert (own_kinds / "references/flux/norm.safetensors").is_file()  # captured as the kind's own reference
    # Its own option, on the command line, makes the same numbers fail: the verdict is the kind's.
    strict = harness(own_kinds, "run", *plan, "--norm-slack", "1e-12", "--report-dir", "strict")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert (own_kinds / "strict/matrix.md").is_file(), strict.stdout + strict.stderr
    assert "flux/ulysses2/native/fp32/norm" in (own_kinds / "strict/matrix.md").read_text()
    assert "is off 1 by more than 1e-12" in (own_kinds / "strict/matrix.md").read_text()
    page = (own_kinds / "strict/index.html").read_text()
    assert "norm_ratio" in page and "output norm / reference norm" in page and "mean_to_max" in page


def test_a_kind_of_your_own_under_pytest(own_kinds):
    (own_kinds / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.harness]
        models = ["flux"]
        layouts = ["ulysses2"]
        backends = ["native"]
        dtypes = ["fp32"]
        kinds = ["norm"]
        modes = ["eager"]
        loads = ["enable"]
        flows = ["none"]
        cpu_max_ranks = 2
        """))
    (own_kinds / "test_matrix.py").write_text(textwrap.dedent("""\
        from harness.plugin import check_parity


        def test_parity(parity_case, parity_results):
            check_parity(parity_case, parity_results)
        """))
    assert harness(own_kinds, "capture", "--kinds", "norm", "--models", "flux").returncode == 0
    passed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_matrix.py"],
                            cwd=own_kinds, capture_output=True, text=True, timeout=600)
    assert passed.returncode == 0 and "1 passed" in passed.stdout, passed.stdout
    failed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_matrix.py",
                             "--harness-norm-slack", "1e-12"], cwd=own_kinds, capture_output=True, text=True,
                            timeout=600)
    assert failed.returncode == 1, failed.stdout
    assert "flux/ulysses2/native/fp32/norm: FAIL norm_ratio=" in failed.stdout and "(limit 1e-12)" in failed.stdout
    assert "--kinds norm" in failed.stdout
