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
from pathlib import Path

from harness.core.errors import HarnessError
from harness.versions.bisect_git import over_git
from harness.versions.cases import planned
from harness.versions.revisions import Revision, parse_revision, released_versions
from harness.versions.search import Echo, Search, Step, ends, finish, must_run, present_since


def bisect(good_text: str, bad_text: str, case_ids: list[str], flags: list[str], overrides: dict,
           report_dir: Path, cache: Path, echo: Echo = print) -> int:
    planned(case_ids, overrides)  # a case the plan does not contain is one clear line, before anything is built
    good, bad = parse_revision(good_text), parse_revision(bad_text)
    search = Search(case_ids, flags, report_dir, cache, overrides={**overrides})
    if good.source == bad.source == "release":
        return over_releases(good, bad, search, echo)
    if good.source == bad.source == "checkout" and good.repo == bad.repo:
        return over_git(good, bad, search, echo)
    raise HarnessError(f"bisect needs two released versions, or two revisions of one checkout; got {good.label} "
                       f"and {bad.label}")


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

    versions = _releases(good, bad)
    fix = Version(bad.version) < Version(good.version)
    echo(f"bisect: {len(versions)} releases from {versions[0]} to {versions[-1]}; searching for the first that "
         f"{'fixed' if fix else 'broke'} {', '.join(search.case_ids)}")
    steps = dict(zip((good.version, bad.version), ends(good, bad, search, echo), strict=True))
    step_at = _stepper(versions, steps, search, echo)
    older, newer = steps[versions[0]], steps[versions[-1]]
    must_run(newer)
    start = 0
    if older.cannot_run():  # an older release without what the cases need: start at the oldest that runs them
        search.good = search.good if fix else None  # the oldest release that runs them says what good is
        start = _oldest_running(versions, step_at)
        older = steps[versions[start]]
        search.good = search.good or older.statuses()
        if older.statuses() == newer.statuses():
            return present_since(older, [steps[v] for v in versions[:start] if v in steps], search, echo)

    def probe(index: int) -> bool | None:
        step = step_at(start + index)
        if step is None or step.cannot_run():
            return None
        return search.is_good(step) == fix  # the new end is the good one when searching for the fix

    old, new, skipped = first_new(len(versions) - start, probe)
    found = [versions[start + i] for i in (old, new, *skipped)]
    return finish(steps[found[0]], steps[found[1]], found[2:], search, echo)


def _releases(good: Revision, bad: Revision) -> list[str]:
    """The released versions from the older end to the newer, pre-releases left out."""
    from packaging.version import Version

    known = released_versions()
    if known is None:
        raise HarnessError("cannot list the released diffusers versions (pip index versions diffusers failed)")
    low, high = sorted((Version(good.version), Version(bad.version)))
    return [v for v in known if low <= Version(v) <= high and not Version(v).is_prerelease]


def _stepper(versions: list[str], steps: dict, search: Search, echo: Echo) -> Callable[[int], Step | None]:
    """The step of the release at an index, run once (None: its environment or run failed, said as skipped)."""
    def step_at(index: int) -> Step | None:
        version = versions[index]
        if version not in steps:
            revision = parse_revision(f"diffusers=={version}")
            try:
                steps[version] = search.evaluate(revision, echo)
            except HarnessError as error:
                echo(f"bisect: {revision.label}: skipped ({error})")
                return None
            search.say(steps[version], echo)
        return steps[version]

    return step_at


def _oldest_running(versions: list[str], step_at: Callable[[int], Step | None]) -> int:
    """The index of the oldest release that runs the cases, the first at index 0 being known not to (a binary
    search: what a release lacks, a later one gains)."""
    def runs(index: int) -> bool | None:
        step = step_at(index)
        return None if step is None else not step.cannot_run()

    return first_new(len(versions), runs)[1]
