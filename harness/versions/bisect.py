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
from harness.versions.search import Echo, Search, ends, finish


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


