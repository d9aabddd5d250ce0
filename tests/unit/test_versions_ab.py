"""`harness ab` end to end over two fake revisions whose `harness run` writes given results (the real releases run in
`nox -s versions`): what each side is asked to run, the base's references reused or replaced, the head's own captures
kept apart and named, the report's sections, and the exit code of a regression (with a fix as negative control)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.versions import ab
from harness.versions.envs import Env
from harness.versions.revisions import Revision
from tests.records import REAL_RUN, tensor_case

FAKE_RUN = """import json, sys, pathlib
side, rows, args = sys.argv[1], json.loads(pathlib.Path(sys.argv[2]).read_text()), sys.argv[4:]
given = dict(arg[2:].split("=", 1) for arg in args if "=" in arg)
out, refs = pathlib.Path(given["report-dir"]), pathlib.Path(given["references"])
(refs / "flux").mkdir(parents=True, exist_ok=True)
found = sorted(path.name for path in (refs / "flux").iterdir())  # what the run found before capturing anything
for name in rows.get("captures", []):
    target = refs / "flux" / name
    if not target.exists():
        target.write_text(side)
out.mkdir(parents=True, exist_ok=True)
(out / "args.json").write_text(json.dumps(args))
(out / "found.json").write_text(json.dumps(found))
(out / "results.json").write_text(json.dumps({"header": rows.get("header", {}), "cases": rows["cases"]}))
sys.exit(1 if any(case["status"] == "FAIL" for case in rows["cases"]) else 0)
"""


def case(case_id: str, max_abs_err: float, vs_single: float | None = None) -> dict:
    """A tensor case as results.json holds it, judged by the harness's own verdict."""
    return tensor_case(case_id, max_abs_err, vs_single).to_dict()


class FakeEnv(Env):
    def harness(self, *args: str) -> list[str]:
        return [sys.executable, str(self.info["script"]), self.info["side"], str(self.info["rows"]), *args]


@pytest.fixture
def sides(tmp_path, monkeypatch):
    """Two revisions whose runs give `rows[side]`; returns (rows, the environments asked for)."""
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN)
    rows, asked = {}, []

    def env_for(revision, cache, echo):
        side = ("base", "head")[len(asked) % 2]  # ab asks for the base first, then the head
        asked.append(revision)
        path = tmp_path / f"{side}.json"
        path.write_text(json.dumps(rows[side]))
        return FakeEnv(revision, Path(sys.executable), info={"script": script, "side": side, "rows": path,
                                                             "key": revision.text})

    monkeypatch.setattr(ab, "env_for", env_for)
    monkeypatch.setattr(ab, "parse_revision", lambda text: Revision(text, "installed"))
    return rows, asked


SINGLE, ULYSSES = "flux/single/native/fp32/tensor", "flux/ulysses2/native/fp32/tensor"


def run_ab(tmp_path, base: str = "one", head: str = "two", accept_known: bool = False) -> tuple[int, list[str]]:
    lines = []
    code = ab.ab(base, head, ["--models=flux", "--layouts=ulysses2", "--kinds=tensor"], tmp_path / "ab",
                 tmp_path / "cache", lines.append, accept_known=accept_known)
    return code, lines


def summary(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith("ab: installed") and " -> " in line)


def test_a_fix_is_reported_and_exits_0_a_regression_exits_1(tmp_path, sides):
    rows, _ = sides
    broken = [case(SINGLE, 0.0), case(ULYSSES, 2.19e-2, vs_single=2.19e-2)]
    fixed = [case(SINGLE, 0.0), case(ULYSSES, 2.4e-7, vs_single=2.4e-7)]
    rows.update(base={"cases": broken, "captures": ["tensor.safetensors"]}, head={"cases": fixed})
    code, lines = run_ab(tmp_path)
    assert code == 0 and "1 changed status (0 regressions)" in summary(lines)
    assert any(line.startswith(f"  FAIL -> PASS  {ULYSSES}") for line in lines)
    args = json.loads((tmp_path / "ab/base/args.json").read_text())
    assert "--layouts=single,ulysses2" in args  # the single layout joins the plan
    rows.update(base={"cases": fixed, "captures": ["tensor.safetensors"]}, head={"cases": broken})
    code, lines = run_ab(tmp_path)
    assert code == 1 and "1 regression)" in summary(lines) and lines[-2].endswith("exit 1: a case newly fails")
    markdown = (tmp_path / "ab/matrix.md").read_text()
    assert "PASS | FAIL" in markdown and (tmp_path / "ab/index.html").is_file() and (tmp_path / "ab/compare.html")


KNOWN_ISSUES = """[[issue]]
match = "flux/ulysses2/*"
title = "ulysses2 drifts"
reason = "a drift of the head's ulysses attention"
link = "https://github.com/huggingface/diffusers/issues/1"
status = "FAIL"
[issue.evidence.max_abs_err]
band = [1e-2, 3e-2]
"""


def known_case(tmp_path, case_id: str, max_abs_err: float) -> dict:
    """A tensor case the head's known-issue list excuses (XFAIL), as `harness run` judges it."""
    from harness.run.known_issues import load_known_issues
    from harness.run.verdict import apply_known_issues

    path = tmp_path / "known_issues.toml"
    path.write_text(KNOWN_ISSUES)
    judged = apply_known_issues(tensor_case(case_id, max_abs_err, max_abs_err), load_known_issues(path))
    assert judged.status.value == "XFAIL", judged.reason
    return judged.to_dict()


def test_a_case_passing_on_the_base_and_known_on_the_head_is_a_regression_naming_its_entry(tmp_path, sides):
    """The head's known-issue list must not excuse the very change ab exists to catch: PASS -> XFAIL exits 1 and
    names the entry; --accept-known exits 0 and still lists it."""
    rows, _ = sides
    passing = [case(SINGLE, 0.0), case(ULYSSES, 2.4e-7, vs_single=2.4e-7)]
    rows.update(base={"cases": passing}, head={"cases": [case(SINGLE, 0.0), known_case(tmp_path, ULYSSES, 2.19e-2)]})
    code, lines = run_ab(tmp_path)
    named = (f"{ULYSSES} PASS -> XFAIL, on the head known issue \"ulysses2 drifts\" [known_issues.toml #1] "
             "(https://github.com/huggingface/diffusers/issues/1)")
    assert code == 1 and "1 changed status (1 regression)" in summary(lines)
    assert f"  regression: {named}" in lines
    assert lines[-2].endswith("exit 1: a case that passed on the base is a known issue on the head (--accept-known "
                              "accepts it)")
    assert f"- regression: {named}" in (tmp_path / "ab/matrix.md").read_text()
    assert "ulysses2 drifts" in (tmp_path / "ab/index.html").read_text()
    code, lines = run_ab(tmp_path, accept_known=True)
    assert code == 0 and "1 changed status (0 regressions), 0 only in NEW, 0 only in OLD, 1 known regression " \
        "accepted" in summary(lines)
    assert f"  accepted (--accept-known): {named}" in lines and "exit 1" not in lines[-2]


@pytest.mark.parametrize(("before", "after"), [("PASS", "PASS"), ("XFAIL", "XFAIL"), ("FAIL", "XFAIL")])
def test_a_case_that_did_not_pass_on_the_base_or_still_passes_is_no_known_regression(tmp_path, sides, before, after):
    """The negative controls: PASS -> PASS and XFAIL -> XFAIL, and a failure the head knows (FAIL -> XFAIL), exit 0."""
    rows, _ = sides
    ulysses = {"PASS": case(ULYSSES, 2.4e-7, vs_single=2.4e-7), "FAIL": case(ULYSSES, 2.19e-2, vs_single=2.19e-2),
               "XFAIL": known_case(tmp_path, ULYSSES, 2.19e-2)}
    rows.update(base={"cases": [case(SINGLE, 0.0), ulysses[before]]},
                head={"cases": [case(SINGLE, 0.0), ulysses[after]]})
    code, lines = run_ab(tmp_path)
    assert code == 0 and f"{int(before != after)} changed status (0 regressions), 0 only in NEW, 0 only in OLD;" \
        in summary(lines)
    assert not any(line.startswith(("  regression:", "  accepted")) for line in lines)
    assert "Known regressions" not in (tmp_path / "ab/matrix.md").read_text()


def test_accept_known_is_an_ab_flag_off_by_default():
    from harness.cli import build_parser

    given = ["ab", "--base", "diffusers==0.40.0", "--head", "diffusers==0.42.1"]
    assert build_parser().parse_args(given).accept_known is False
    assert build_parser().parse_args([*given, "--accept-known"]).accept_known is True


def test_a_changed_model_is_told_from_a_parallel_bug(tmp_path, sides):
    rows, _ = sides
    base = [case(SINGLE, 0.0), case(ULYSSES, 2.4e-7, vs_single=2.4e-7)]
    head = [case(SINGLE, 3e-2), case(ULYSSES, 3e-2, vs_single=2.4e-7)]
    rows.update(base={"cases": base}, head={"cases": head})
    code, lines = run_ab(tmp_path)
    assert "single device: the model itself changed: " + SINGLE in summary(lines)
    assert f"parallel parity, head: 1 FAIL; worst fp32 layout against its own single-device run: tensor 2.4e-07 " \
           f"({ULYSSES})" in lines
    rows["head"]["cases"] = [case(SINGLE, 0.0), head[1]]  # negative control: the model unchanged
    code, lines = run_ab(tmp_path)
    assert "single device: unchanged" in summary(lines)


def test_the_base_references_are_reused_only_for_the_same_revision(tmp_path, sides):
    rows, _ = sides
    rows.update(base={"cases": [case(SINGLE, 0.0)], "captures": ["tensor.safetensors"]},
                head={"cases": [case(SINGLE, 0.0)], "captures": ["image.safetensors"]})
    run_ab(tmp_path)
    reference = tmp_path / "ab/references/flux/tensor.safetensors"
    assert reference.read_text() == "base"
    assert json.loads((tmp_path / "ab/head/found.json").read_text()) == ["tensor.safetensors"]  # the base's, first
    assert (tmp_path / "ab/head/references/flux/tensor.safetensors").read_text() == "base"
    reference.write_text("kept")
    code, lines = run_ab(tmp_path)
    assert reference.read_text() == "kept" and "ab: reusing the base's references" in "\n".join(lines)
    assert any("the base has no reference for flux/image.safetensors" in line for line in lines)
    assert not (tmp_path / "ab/references/flux/image.safetensors").exists()  # the head's capture stays its own
    run_ab(tmp_path, base="another")  # negative control: another base revision captures anew
    assert reference.read_text() == "base"


def test_a_real_run_shows_each_sides_parity_and_the_single_device_run_of_the_train_cases(tmp_path, sides):
    """On a real run's results.json: the parity line names the fp32 layout furthest from its own single-device run
    (found missing: it read a field that had moved into the figures), and the train kind, which runs no single
    layout there, shows the single-device run measured inside its ulysses2 case, the base's beside the head's."""
    rows, _ = sides
    real = json.loads(REAL_RUN.read_text())["cases"]
    rows.update(base={"cases": real}, head={"cases": real})
    code, lines = run_ab(tmp_path)
    assert code == 0 and "single device: unchanged (largest error 0)" in summary(lines)
    assert "parallel parity, head: 6 PASS; worst fp32 layout against its own single-device run: tensor 1.79e-07 " \
           "(flux/ulysses2/native/fp32/tensor)" in lines
    assert "  flux/ulysses2/native/fp32/train (its single-device run): base single_grad_err=0; head " \
           "single_grad_err=0" in lines
    assert "  flux/single/native/fp32/tensor: base PASS max_abs_err=0; head PASS max_abs_err=0" in lines
    assert "| `flux/ulysses2/native/fp32/train (its single-device run)` | single_grad_err=0 | single_grad_err=0 |" \
        in (tmp_path / "ab/matrix.md").read_text()
def test_with_coverage_the_report_names_parallel_code_the_head_adds_and_never_runs(tmp_path, sides):
    from harness.core.coverage import UNKNOWN, CoverageReport, FunctionCoverage, Gap, ModuleCoverage

    def measured(*functions) -> dict:
        return {"coverage": CoverageReport("0.42.1", [ModuleCoverage("hooks/context_parallel.py", "hooks",
                                                                     list(functions))]).to_dict()}

    old = FunctionCoverage("apply_context_parallel", 80, 90, [81, 82], [81, 82])
    new = FunctionCoverage("shard_sideways", 100, 110, [101, 102], [], [Gap([101, 102], UNKNOWN, "nothing")])
    cases = [case(SINGLE, 0.0), case(ULYSSES, 2.4e-7, vs_single=2.4e-7)]
    rows, _ = sides
    rows.update(base={"cases": cases, "header": measured(old)}, head={"cases": cases, "header": measured(old, new)})
    code, lines = run_ab(tmp_path)
    said = "parallel code the plan never runs: hooks/context_parallel.py: shard_sideways (new in the head; 2 never"
    assert code == 0 and any(line.startswith(said) for line in lines), lines
    assert said in (tmp_path / "ab/matrix.md").read_text() and said in (tmp_path / "ab/index.html").read_text()
    rows["head"]["header"] = measured(old)  # negative control: nothing added, nothing said
    code, lines = run_ab(tmp_path)
    assert not any("never runs" in line for line in lines)
