"""What changed against a base run, as index.html shows it (changes.py computes it): a line under the verdict that
counts each kind of change, a section with one closed group per kind whose rows the page script draws when it is
opened (each row saying what the case was), and the marks the script puts on each matrix cell."""

from __future__ import annotations

from html import escape

from harness.core.results import CaseResult
from harness.report.changes import KINDS, MOVED
from harness.report.sections import Group, group_section

PREFIX = "c"  # the key of a group of changed cases in the page's data: `c0` the new failures, ...
COLOURS = {"new failure": "FAIL", "fixed": "PASS"}  # a group's colour, a status's (the others: XPASS's, news)


def changes_line(base, changed: dict[int, list[str]], unread: str) -> str:
    """Under the verdict: against which base run, and how many cases changed in each way (or why it could not be
    read)."""
    if unread:
        return f'<div class="banner" role="alert">\u26a0 Base run not read: {escape(unread)}</div>'
    tally = _tally(changed)
    said = ", ".join(f"{n} {_plural(kind, n)}" for kind, n in tally.items() if n) or "nothing changed"
    return (f'<p class="env-line" id="changes-line"><b>against the base run</b> <code>{escape(str(base))}</code>: '
            f'<a href="#changed">{escape(said)}</a> (a changed figure: its deciding check moved by {MOVED}x of its '
            "allowance or more)</p>")


def changed_groups(changed: dict[int, list[str]]) -> dict[str, list[int]]:
    """The page's groups of changed cases, one per kind in KINDS' order, by key."""
    return {group.key: group.members for group in _groups(changed)}


def changes_section(cases: list[CaseResult], changed: dict[int, list[str]]) -> str:
    """One closed group per kind of change, its rows (what the case was, what it is) drawn when opened."""
    return group_section("changed", "What changed against the base run", _groups(changed), cases, "kind", "XPASS")


def _groups(changed: dict[int, list[str]]) -> list[Group]:
    members = {kind: [i for i, change in sorted(changed.items()) if change[0] == kind] for kind in KINDS}
    return [Group(f"{PREFIX}{n}", f"{_plural(kind, len(found))}: {KINDS[kind]}", found,
                  status=COLOURS.get(kind, "XPASS")) for n, (kind, found) in enumerate(members.items()) if found]


def _tally(changed: dict[int, list[str]]) -> dict[str, int]:
    return {kind: sum(1 for change in changed.values() if change[0] == kind) for kind in KINDS}


def _plural(kind: str, n: int) -> str:
    words = {"status": "other status change", "figure": "changed figure"}.get(kind, kind)
    return words if n == 1 or kind == "fixed" else f"{words}s"
