"""The bisect searches without environments: the binary search over releases against a status oracle, and `git bisect
run` driven over a tiny repository with a fake step that reads the status from the commit itself (the real steps,
which build environments and run the harness, run in `nox -s versions`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.core.errors import HarnessError
from harness.core.results import read_results
from harness.versions import bisect, revisions
from harness.versions.bisect_git import _read_steps, run_bisect
from harness.versions.search import Step
from tests.records import REAL_RUN
from tests.unit.versions_helpers import RELEASES, fake_checkout, git, state_of


@pytest.mark.parametrize("count", range(2, 12))
def test_the_search_finds_every_change_point_in_log_steps(count):
    for change in range(1, count):
        asked = []

        def probe(index, change=change, asked=asked):
            asked.append(index)
            return index >= change

        assert bisect.first_new(count, probe)[:2] == (change - 1, change)
        assert len(asked) <= max(1, (count - 2).bit_length())  # ceil(log2) of the untested middle
        assert len(set(asked)) == len(asked) and 0 not in asked and count - 1 not in asked  # ends are known


def test_an_untestable_revision_is_skipped_and_named_when_it_hides_the_change():
    # new from index 3; index 3 cannot be tested: the change lies between 2 and 4 with 3 unknown
    assert bisect.first_new(6, lambda index: None if index == 3 else index >= 3) == (2, 4, [3])
    # an untestable revision away from the change does not blur it
    assert bisect.first_new(8, lambda index: None if index == 2 else index >= 5) == (4, 5, [])


def test_a_case_id_outside_the_plan_is_one_clear_line(tmp_path):
    with pytest.raises(HarnessError, match="not in the plan") as caught:
        bisect.bisect("diffusers==0.38.0", "diffusers==0.39.0", ["flux@masked/ulysses2/native/fp32/tensor"], [], {},
                      tmp_path, tmp_path)  # flux has no masked shape
    assert "\n" not in str(caught.value)
    with pytest.raises(HarnessError, match="is not of the form"):
        bisect.bisect("diffusers==0.38.0", "diffusers==0.39.0", ["flux/ulysses2/native/fp32"], [], {}, tmp_path,
                      tmp_path)


def test_two_kinds_of_revision_cannot_be_bisected(tmp_path, monkeypatch):
    monkeypatch.setattr(revisions, "released_versions", lambda: RELEASES)
    repo = fake_checkout(tmp_path / "repo")
    with pytest.raises(HarnessError, match="two released versions, or two revisions of one checkout"):
        bisect.bisect("diffusers==0.38.0", str(repo), ["flux/ulysses2/native/fp32/tensor"], [], {}, tmp_path,
                      tmp_path)


STEP = """import sys, pathlib
status = pathlib.Path("status").read_text().strip()
print(f"bisect: {status}", flush=True)
sys.exit({"good": 0, "bad": 1, "skip": 125}[status] if sys.argv[1] == "broke" else
         {"good": 1, "bad": 0, "skip": 125}[status])
"""


def history(folder: Path, statuses: list[str]) -> tuple[Path, list[str]]:
    """A repository with one commit per status (the file `status` holds it) and the commits, oldest first."""
    repo = fake_checkout(folder)
    commits = []
    for index, status in enumerate(statuses):
        (repo / "status").write_text(status + "\n")
        (repo / "step").write_text(f"{index}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", status)
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


@pytest.mark.parametrize("search, statuses, terms, first", [
    ("broke", ["good", "good", "good", "bad", "bad", "bad", "bad"], ("good", "bad"), 3),
    ("fixed", ["bad", "bad", "good", "good", "good"], ("broken", "fixed"), 2),
    ("broke", ["good", "skip", "good", "good", "bad"], ("good", "bad"), 4),
])
def test_git_bisect_run_finds_the_first_changed_commit_in_a_worktree_of_its_own(tmp_path, search, statuses, terms,
                                                                                 first):
    repo, commits = history(tmp_path / "repo", statuses)
    before = state_of(repo)
    step = tmp_path / "step.py"
    step.write_text(STEP)
    lines = []
    found, skipped = run_bisect(repo, commits[0], commits[-1], terms, [sys.executable, str(step), search], tmp_path,
                                tmp_path / "cache", lines.append)
    assert found == commits[first] and skipped == []
    assert lines and all(line.startswith("bisect: ") for line in lines)  # the steps' own lines are shown
    assert state_of(repo) == before  # HEAD, branch, status and worktrees of the user's checkout as they were


def test_git_bisect_names_the_skipped_commits_that_hide_the_change(tmp_path):
    repo, commits = history(tmp_path / "repo", ["good", "good", "skip", "bad"])
    step = tmp_path / "step.py"
    step.write_text(STEP)
    found, skipped = run_bisect(repo, commits[0], commits[-1], ("good", "bad"), [sys.executable, str(step), "broke"],
                                tmp_path, tmp_path / "cache", lambda line: None)
    assert [commit[:7] for commit in skipped] == [commits[2][:7], commits[3][:7]]


def test_a_git_bisect_step_reaches_the_parent_as_the_records_it_ran(tmp_path):
    """Each `git bisect run` step appends its revision's cases to steps.jsonl; the parent reads them back whole, to
    name the first changed commit's figures and write its repro scripts."""
    step = Step("abc1234 a commit", {case.case_id: case for case in read_results(REAL_RUN)[1]}, "/env/bin/python")
    steps = tmp_path / "steps.jsonl"
    steps.write_text(json.dumps({"commit": "abc1234", **step.to_dict()}) + "\n")
    assert _read_steps(steps) == {"abc1234": step}
    assert step.lines()[0] == "flux/single/native/fp32/tensor PASS max_abs_err=0"


CASE = "flux/tp2/native/fp32/tensor/add_adapter_after"


def _fake_search(tmp_path, monkeypatch, statuses: dict[str, str]):
    """A Search whose runs read each release's status from `statuses` (N/A: the release cannot run the case), and
    the releases it was asked for."""
    from harness.core.results import CaseResult, Status
    from harness.versions.search import Search

    monkeypatch.setattr(bisect, "released_versions", lambda: RELEASES)
    asked = []

    def evaluate(self, revision, echo):
        asked.append(revision.version)
        status = Status(statuses[revision.version])
        case = CaseResult(CASE, "flux", "default", "tensor", "tp2", 2, "native", "fp32", status,
                          reason="no TensorParallelConfig" if not status.ran else "")
        return Step(revision.label, {CASE: case})

    monkeypatch.setattr(Search, "evaluate", evaluate)
    return Search([CASE], [], tmp_path, tmp_path), asked


def _run(tmp_path, monkeypatch, statuses, good="0.36.0", bad="0.42.1"):
    search, asked = _fake_search(tmp_path, monkeypatch, statuses)
    lines = []
    code = bisect.over_releases(revisions.parse_revision(f"diffusers=={good}"),
                                revisions.parse_revision(f"diffusers=={bad}"), search, lines.append)
    return code, lines, asked


def test_releases_that_cannot_run_a_case_are_neither_good_nor_bad(tmp_path, monkeypatch):
    # tensor parallelism from 0.40.0: the releases before are N/A; the case FAILs from 0.41.0 on
    statuses = {"0.36.0": "N/A", "0.37.0": "N/A", "0.37.1": "N/A", "0.38.0": "N/A", "0.39.0": "N/A",
                "0.40.0": "PASS", "0.41.0": "FAIL", "0.42.0": "FAIL", "0.42.1": "FAIL"}
    code, lines, asked = _run(tmp_path, monkeypatch, statuses)
    assert code == 0 and f"first revision that changed ({CASE} PASS -> FAIL): diffusers 0.41.0" in "\n".join(lines)
    assert any("diffusers 0.39.0" in line and "cannot run it, neither good nor bad" in line for line in lines)
    assert not any("N/A" in line and line.endswith(("-> good", "-> bad")) for line in lines)
    assert len(asked) == len(set(asked))  # each release runs once


def test_a_finding_present_in_the_oldest_release_that_runs_it_is_said_so(tmp_path, monkeypatch):
    statuses = {version: "N/A" for version in RELEASES} | {"0.40.0": "FAIL", "0.41.0": "FAIL", "0.42.0": "FAIL",
                                                           "0.42.1": "FAIL"}
    code, lines, _ = _run(tmp_path, monkeypatch, statuses)
    said = "\n".join(lines)
    assert code == 0 and "the same statuses" in said and "from diffusers 0.40.0, the oldest that runs them" in said
    assert "diffusers 0.36.0: cannot run it: " in said and "first revision that changed" not in said
    # its negative control: the same run with 0.40.0 passing names the change instead
    code, lines, _ = _run(tmp_path, monkeypatch, {**statuses, "0.40.0": "PASS"})
    said = "\n".join(lines)
    assert f"({CASE} PASS -> FAIL): diffusers 0.41.0" in said and "0.40.0: " + CASE + " PASS -> runs it" in said


def test_a_newer_end_that_cannot_run_the_case_is_one_clear_line(tmp_path, monkeypatch):
    statuses = {version: "N/A" for version in RELEASES} | {"0.36.0": "FAIL"}
    with pytest.raises(HarnessError, match="diffusers 0.42.1 cannot run the case.*neither good nor bad"):
        _run(tmp_path, monkeypatch, statuses)
