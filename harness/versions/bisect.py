"""`harness bisect --good REV --bad REV --case CASE_ID`: the first revision at which a case's status changed.

Between two releases it searches the released versions between them (a binary search, each step one environment
and one `harness run` of just those cases); between two revisions of one checkout it drives `git bisect run`
(harness.versions.bisect_git). A revision is "good" when every case has the status it has at --good, "bad"
otherwise; when --bad is the older end the search is for the fix (git's terms `broken`/`fixed`), else for the
breakage (`good`/`bad`). Every revision compares with the same references (`--references`, default the project's:
a missing one is captured once, by the --good revision, which runs first). Environments are cached as `ab`'s are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import HarnessError
from harness.versions.cases import as_flags, plan_options, planned
from harness.versions.envs import env_for
from harness.versions.revisions import Revision, parse_revision, released_versions
from harness.versions.sides import results, run_harness, status_line

Echo = Callable[[str], None]


@dataclass
class Step:
    """One revision's run of the cases: {case_id: its result row}."""

    label: str
    cases: dict
    python: str | None = None  # the interpreter of its environment (runs a repro script with its diffusers)

    def statuses(self) -> dict[str, str]:
        return {case_id: case["status"] for case_id, case in self.cases.items()}

    def lines(self) -> list[str]:
        return [f"{case_id} {status_line(case)}" for case_id, case in self.cases.items()]


@dataclass
class Search:
    """What every step needs: the cases, the flags of their runs, where reports and environments go, and the
    statuses that make a revision good."""

    case_ids: list[str]
    flags: list[str]
    report_dir: Path
    cache: Path
    good: dict | None = None  # {case_id: status} at --good
    overrides: dict | None = None  # the options given (for the plan a repro script is checked against)

    def evaluate(self, revision: Revision, echo: Echo) -> Step:
        env = env_for(revision, self.cache, echo)
        folder = self.report_dir / revision.slug
        run_harness(env, ["run", *self.flags, *as_flags(plan_options(self.case_ids)), f"--report-dir={folder}"],
                    folder / "run.log")
        rows = {case["case_id"]: case for case in results(folder)[1]}
        missing = [case_id for case_id in self.case_ids if case_id not in rows]
        if missing:
            raise HarnessError(f"{revision.label}: its run has no case {', '.join(missing)} (log: "
                               f"{folder / 'run.log'})")
        return Step(revision.label, {case_id: rows[case_id] for case_id in self.case_ids}, str(env.python))

    def is_good(self, step: Step) -> bool:
        return step.statuses() == self.good

    def say(self, step: Step, echo: Echo) -> None:
        verdict = "good" if self.is_good(step) else "bad"
        for line in step.lines():
            echo(f"bisect: {step.label}: {line} -> {verdict}")


def bisect(good_text: str, bad_text: str, case_ids: list[str], flags: list[str], overrides: dict,
           report_dir: Path, cache: Path, echo: Echo = print) -> int:
    planned(case_ids, overrides)  # a case the plan does not contain is one clear line, before anything is built
    good, bad = parse_revision(good_text), parse_revision(bad_text)
    search = Search(case_ids, flags, report_dir, cache, overrides={**overrides})
    if good.source == bad.source == "release":
        return over_releases(good, bad, search, echo)
    if good.source == bad.source == "checkout" and good.repo == bad.repo:
        from harness.versions.bisect_git import over_git

        return over_git(good, bad, search, echo)
    raise HarnessError(f"bisect needs two released versions, or two revisions of one checkout; got {good.label} "
                       f"and {bad.label}")


def ends(good: Revision, bad: Revision, search: Search, echo: Echo) -> tuple[Step, Step]:
    """Both ends, --good first (it captures any missing reference); the same statuses at both is an error."""
    first = search.evaluate(good, echo)
    search.good = first.statuses()
    search.say(first, echo)
    last = search.evaluate(bad, echo)
    search.say(last, echo)
    if last.statuses() == first.statuses():
        said = "; ".join(f"{case_id} {status}" for case_id, status in first.statuses().items())
        raise HarnessError(f"the case never changes between {good.label} and {bad.label} ({said} at both ends): "
                           "nothing to bisect")
    return first, last


def first_new(count: int, probe: Callable[[int], bool | None]) -> tuple[int, int, list[int]]:
    """Binary search over items 0..count-1 where 0 is old and count-1 is new: (last old, first new, the skipped
    items between them). `probe(i)` is True for new, False for old, None for a revision that cannot be tested."""
    old, new, skipped = 0, count - 1, set()
    while True:
        left = [i for i in range(old + 1, new) if i not in skipped]
        if not left:
            return old, new, sorted(i for i in skipped if old < i < new)
        middle = min(left, key=lambda i: (abs(i - (old + new) / 2), i))
        verdict = probe(middle)
        if verdict is None:
            skipped.add(middle)
        elif verdict:
            new = middle
        else:
            old = middle


def over_releases(good: Revision, bad: Revision, search: Search, echo: Echo) -> int:
    from packaging.version import Version

    known = released_versions()
    if known is None:
        raise HarnessError("cannot list the released diffusers versions (pip index versions diffusers failed)")
    low, high = sorted((Version(good.version), Version(bad.version)))
    versions = [v for v in known if low <= Version(v) <= high and not Version(v).is_prerelease]
    fix = Version(bad.version) < Version(good.version)
    echo(f"bisect: {len(versions)} releases from {versions[0]} to {versions[-1]}; searching for the first that "
         f"{'fixed' if fix else 'broke'} {', '.join(search.case_ids)}")
    first, last = ends(good, bad, search, echo)
    steps = {good.version: first, bad.version: last}

    def probe(index: int) -> bool | None:
        revision = parse_revision(f"diffusers=={versions[index]}")
        try:
            step = steps[versions[index]] = search.evaluate(revision, echo)
        except HarnessError as error:
            echo(f"bisect: {revision.label}: skipped ({error})")
            return None
        search.say(step, echo)
        return search.is_good(step) == fix  # the new end is the good one when searching for the fix

    old, new, skipped = first_new(len(versions), probe)
    return finish(steps[versions[old]], steps[versions[new]], [versions[i] for i in skipped], search, echo)


def finish(before: Step, after: Step, skipped: list[str], search: Search, echo: Echo) -> int:
    """The first revision that changed, the figures either side, and a repro script for the failing side."""
    changes = ", ".join(f"{case_id} {before.statuses()[case_id]} -> {after.statuses()[case_id]}"
                        for case_id in search.case_ids)
    where = f"between {before.label} and {after.label} (untestable: {', '.join(skipped)})" if skipped else \
        after.label
    lines = [f"bisect: first revision that changed ({changes}): {where}",
             *(f"  {before.label}: {line}" for line in before.lines()),
             *(f"  {after.label}: {line}" for line in after.lines())]
    for line in lines:
        echo(line)
    search.report_dir.mkdir(parents=True, exist_ok=True)
    (search.report_dir / "bisect.md").write_text("\n".join(["```", *lines, "```", ""]), encoding="utf-8")
    for step in (before, after):
        for case_id in [case_id for case_id, case in step.cases.items() if case["status"] == "FAIL"]:
            echo(f"repro ({step.label}) {case_id}: {_repro(case_id, step, search)}")
    return 0


def _repro(case_id: str, step: Step, search: Search) -> str:
    """The command that runs the case's standalone script with that revision's diffusers (or why there is none)."""
    from harness.versions.repro import run_command, write_repro

    name = case_id.replace("/", "-").replace("@", "-")
    try:
        out, _ = write_repro(case_id, search.report_dir / "repro" / f"{name}.py", search.overrides)
    except HarnessError as error:
        return f"not scripted: {error}"
    return run_command(out, step.cases[case_id]["world_size"], step.python)
