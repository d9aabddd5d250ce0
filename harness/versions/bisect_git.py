"""`harness bisect` over a git range of one diffusers checkout: `git bisect run` in a detached worktree of our own
(bisect state is per worktree, so the user's checkout, its HEAD and any bisect of its own are left alone), each step
`python -m harness.versions.bisect_git STATE` here: it builds (or reuses) the commit's environment, runs the cases,
prints one line per case and exits 0 (like the old end), 1 (like the new end) or 125 (cannot be tested, or a case
SKIP or N/A there: git skips it). Terms: `good`/`bad` when searching for the breakage, `broken`/`fixed` when
searching for the fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harness.core.errors import HarnessError
from harness.versions.revisions import Revision, checkout, git
from harness.versions.search import Echo, Search, Step, ends, finish, must_run

_GIT_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX", "GIT_COMMON_DIR")


def over_git(good: Revision, bad: Revision, search: Search, echo: Echo) -> int:
    for end in (good, bad):
        if end.dirty:
            raise HarnessError(f"bisect needs commits: {end.repo} has uncommitted changes; commit them or name a ref "
                               f"({end.repo}@<ref>)")
    old, new = _ordered(good, bad)
    fix = old is bad
    terms = ("broken", "fixed") if fix else ("good", "bad")
    first, last = ends(good, bad, search, echo)
    must_run(first if new is good else last)  # the older end may not run the cases: git skips those after it
    state = search.report_dir / "bisect-state.json"
    steps = search.report_dir / "steps.jsonl"
    steps.unlink(missing_ok=True)
    state.write_text(json.dumps({"repo": str(good.repo), "cwd": os.getcwd(), "case_ids": search.case_ids,
                                 "flags": search.flags, "report_dir": str(search.report_dir),
                                 "cache": str(search.cache), "good": search.good, "fix": fix,
                                 "steps": str(steps)}, indent=1))
    step_command = [sys.executable, "-m", __name__, str(state)]
    found, skipped = run_bisect(good.repo, old.commit, new.commit, terms, step_command, search.report_dir,
                                search.cache, echo)
    known = {good.commit: first, bad.commit: last, **_read_steps(steps)}
    parent = git(good.repo, "rev-parse", f"{found}^", fail=f"cannot read the parent of {found}")
    subject = git(good.repo, "log", "-1", "--format=%h %s", found, fail=f"cannot read {found}")
    echo(f"bisect: first {terms[1]} commit: {subject}")
    before = known.get(parent) or search.evaluate(checkout(good.repo, parent), echo)  # a skipped parent: says why
    return finish(before, known[found], skipped, search, echo)


def _ordered(good: Revision, bad: Revision) -> tuple[Revision, Revision]:
    """(older, newer): one end must be an ancestor of the other."""
    def ancestor(a: Revision, b: Revision) -> bool:
        return subprocess.run(["git", "-C", str(a.repo), "merge-base", "--is-ancestor", a.commit, b.commit],
                              capture_output=True).returncode == 0

    if ancestor(good, bad):
        return good, bad
    if ancestor(bad, good):
        return bad, good
    raise HarnessError(f"{good.label} and {bad.label}: neither is an ancestor of the other, so there is no range "
                       "to bisect")


def run_bisect(repo: Path, old: str, new: str, terms: tuple[str, str], step_command: list[str], report_dir: Path,
               cache: Path, echo: Echo) -> tuple[str, list[str]]:
    """`git bisect run STEP` in a worktree of our own, removed afterwards; (the first new commit, the commits it had
    to skip when those leave the answer open)."""
    worktree = cache / "bisect" / f"{repo.name}-{os.getpid()}"
    worktree.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "worktree", "add", "--detach", str(worktree), new, fail=f"cannot check out {new} into {worktree}")
    log = report_dir / "git-bisect.log"
    try:
        git(worktree, "bisect", "start", f"--term-old={terms[0]}", f"--term-new={terms[1]}", new, old,
            fail="git bisect start failed")
        said = _stream(["git", "-C", str(worktree), "bisect", "run", *step_command], log, echo)
        found = git(worktree, "rev-parse", f"refs/bisect/{terms[1]}", fail=f"git bisect found nothing (log: {log})")
        skipped = [line.split()[0] for line in said[1:] if re.match(r"^[0-9a-f]{7,40}\b", line)]
    finally:
        subprocess.run(["git", "-C", str(worktree), "bisect", "reset", "--quiet"], capture_output=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(worktree)], capture_output=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)
    return found, skipped


def _stream(command: list[str], log: Path, echo: Echo) -> list[str]:
    """Run git bisect run: the steps' own lines shown, everything logged. Returns git's closing lines when only
    skipped commits were left ("... could be any of:" and the commits)."""
    tail: list[str] = []
    with open(log, "w") as handle, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                    text=True, env=_clean_env()) as process:
        for line in process.stdout:
            handle.write(line)
            if line.startswith(("bisect: ", "env: ")):
                echo(line.rstrip())
            tail = [*tail[-40:], line.rstrip()]
        code = process.wait()
    start = next((i for i, line in enumerate(tail) if "could be any of" in line), None)
    if start is not None:  # git exits non-zero then, yet the range is narrowed as far as it goes
        return tail[start:]
    if code != 0:
        raise HarnessError(f"git bisect run failed: {tail[-1] if tail else ''} (log: {log})")
    return []


def _clean_env() -> dict:
    return {key: value for key, value in os.environ.items() if key not in _GIT_VARIABLES}


def _read_steps(path: Path) -> dict[str, Step]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["commit"]: Step.from_dict(row) for row in rows}


def step(state_path: str) -> int:
    """One `git bisect run` step, in the bisect worktree: 0 old-like, 1 new-like, 125 untestable."""
    for name in _GIT_VARIABLES:
        os.environ.pop(name, None)
    state = json.loads(Path(state_path).read_text())
    commit = git(Path.cwd(), "rev-parse", "HEAD", fail="cannot read the commit under test")
    os.chdir(state["cwd"])  # the project's folder: its [tool.harness] and references apply to every step
    search = Search(state["case_ids"], state["flags"], Path(state["report_dir"]), Path(state["cache"]),
                    state["good"])
    echo = lambda line: print(line, flush=True)  # noqa: E731 - the parent reads these lines
    try:
        result = search.evaluate(checkout(Path(state["repo"]), commit), echo)
    except HarnessError as error:
        echo(f"bisect: {commit[:10]}: skipped ({error})")
        return 125
    with open(state["steps"], "a") as handle:
        handle.write(json.dumps({"commit": commit, **result.to_dict()}) + "\n")
    search.say(result, echo)
    if result.cannot_run():
        return 125
    return 0 if search.is_good(result) != state["fix"] else 1


if __name__ == "__main__":
    raise SystemExit(step(sys.argv[1]))
