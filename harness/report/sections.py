"""The case lists of index.html: what needs a look one row per case, everything else summarised in groups.

A full plan's thousands of SKIP and XFAIL cases say a few things many times over, so they are grouped by reason
(a SKIP's reason, an XFAIL's known issue) with a count and exact id patterns; a group's rows are drawn by the page
script only when it is opened. FAIL, ERROR, TIMEOUT and XPASS are listed first, one row each, always. An XFAIL
group is titled by the known-issue entries that excused its cases, each linked to its traced cause.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from html import escape

from harness.core.results import SEVERITIES, CaseResult, Status
from harness.report.data import ATTENTION, anchor, issue_of
from harness.report.detail import badge, cause_link, issue_anchor, linked
from harness.report.idsets import compact

PATTERN_CHARS = 1200  # past this many characters of id patterns a group says how many more there are


@dataclass
class Group:
    """Cases sharing one reason; `key` names the group in the page's data (`g` in embed.encode). A group of known
    issues is titled by its entries' titles, each linked to its traced cause (`entries`), with the reason they give
    (`cause`) in its body; the page strips `cause` (or the title) from the front of each row's reason."""

    key: str
    title: str
    members: list[int] = field(default_factory=list)
    entries: list[dict[str, str]] = field(default_factory=list)
    cause: str = ""
    severity: str = ""  # an XFAIL or REFUSED group's kind of finding (SEVERITIES)
    status: str = ""  # its cases' status where the section holds more than one (XFAIL, REFUSED)


@dataclass
class Lists:
    """Every case in exactly one place: `attention` one by one, the others in their section's groups."""

    attention: list[int]
    xfail: list[Group]
    skip: list[Group]
    passing: list[Group]
    not_applicable: list[Group]

    def groups(self) -> dict[str, list[int]]:
        every = (*self.xfail, *self.skip, *self.passing, *self.not_applicable)
        return {group.key: group.members for group in every}


def split(cases: list[CaseResult]) -> Lists:
    """Failing and XPASS cases first (in that order of status, then plan order); XFAIL and REFUSED by the known
    issues that excused them (or the expected refusal), the most severe kind first (silently wrong, crash, hang,
    refusal: SEVERITIES), SKIP and N/A by reason, PASS with a note by note, plain PASS by model; within each, the
    biggest group first."""
    attention = sorted((i for i, case in enumerate(cases) if case.status.needs_a_look),
                       key=lambda i: ATTENTION.index(cases[i].status.value))
    xfail, skip, noted, plain, absent = {}, {}, {}, {}, {}
    for i, case in enumerate(cases):
        if case.status in (Status.XFAIL, Status.REFUSED):
            xfail.setdefault((case.status.value, _issues(case)), []).append(i)
        elif case.status is Status.SKIP:
            skip.setdefault(case.reason, []).append(i)
        elif case.status is Status.NOT_APPLICABLE:
            absent.setdefault(case.reason, []).append(i)
        elif case.status is Status.PASS and case.reason:
            noted.setdefault(case.reason, []).append(i)
        elif case.status is Status.PASS:
            plain.setdefault(f"{case.model}: passing", []).append(i)
    known = sorted((_known(group, cases) for group in _groups("x", xfail)), key=lambda group: _RANK[group.severity])
    passing = _groups("n", noted) + _groups("p", plain, by_size=False)
    return Lists(attention, known, _groups("k", skip), passing, _groups("a", absent))


def _issues(case: CaseResult) -> str:
    """What groups an XFAIL: the entries that excused it, by key, or the refusal it matched."""
    keys = [entry.get("key", "") for entry in case.known_issues]
    return " + ".join(keys) if keys else issue_of(case)


def _known(group: Group, cases: list[CaseResult]) -> Group:
    """An XFAIL or REFUSED group titled by its entries (as its first case carries them), the reason they give in
    its body, and its kind of finding."""
    first = cases[group.members[0]]
    group.severity, group.status = first.severity, first.status.value
    group.title = issue_of(first)
    if first.known_issues:
        group.entries = first.known_issues
        group.cause = issue_of(first)
        group.title = " + ".join(entry.get("title") or entry.get("key", "") for entry in first.known_issues)
    return group


def _groups(prefix: str, members: dict, by_size: bool = True) -> list[Group]:
    items = sorted(members.items(), key=lambda item: -len(item[1])) if by_size else list(members.items())
    return [Group(f"{prefix}{n}", title if isinstance(title, str) else title[-1], indices)
            for n, (title, indices) in enumerate(items)]


_RANK = {severity: n for n, severity in enumerate(SEVERITIES)}  # a group's place in its section


def attention_section(cases: list[CaseResult], indices: list[int]) -> str:
    """One row per failing or XPASS case: status, id (opens the detail), its key figure and its whole reason."""
    tally: dict[str, int] = {}
    for i in indices:
        tally[cases[i].status.value] = tally.get(cases[i].status.value, 0) + 1
    counts = ", ".join(f"{n} {status}" for status, n in tally.items())
    heading = f"<h2>Needs a look ({len(indices)}{': ' + escape(counts) if counts else ''})</h2>"
    if not indices:
        return (f'<section id="failing">{heading}<p class="none">Nothing failed and no known issue stopped '
                "reproducing.</p></section>")
    rows = "".join(case_row(cases[i], i) for i in indices)
    return (f'<section id="failing">{heading}<table class="cases"><thead><tr><th scope="col">status</th>'
            '<th scope="col">case</th><th scope="col">key figure</th><th scope="col">reason</th></tr></thead>'
            f'<tbody>{rows}</tbody></table><p class="none no-match" hidden>No case here matches the filters.</p>'
            "</section>")


def case_row(case: CaseResult, index: int) -> str:
    """The same row the page script draws in an opened group (static/report.js `caseRow`), so both look alike."""
    return (f'<tr class="case-row" data-i="{index}"><td>{badge(case.status.value)}</td>'
            f'<td><a class="case-link" href="#{escape(anchor(case.case_id))}"><code>{escape(case.case_id)}'
            f'</code></a></td><td class="n">{escape(case.cell)}</td>'
            f'<td><div class="reason-cell">{linked(case.reason)}</div></td></tr>')


def group_section(section_id: str, title: str, groups: list[Group], cases: list[CaseResult], what: str,
                  status: str, tail: str = "") -> str:
    """A heading with totals, then one closed <details> per group: count, reason, id patterns; rows on opening;
    then `tail`."""
    total = sum(len(group.members) for group in groups)
    heading = (f"<h2>{escape(title)} ({total} case{'' if total == 1 else 's'}, {len(groups)} {what}"
               f"{'' if len(groups) == 1 else 's'})</h2>")
    if not groups:
        return f'<section id="{section_id}">{heading}<p class="none">None.</p>{tail}</section>'
    body = "".join(_group(group, cases, status) for group in groups)
    return (f'<section id="{section_id}">{heading}{body}'
            f'<p class="none no-match" hidden>No case here matches the filters.</p>{tail}</section>')


def _group(group: Group, cases: list[CaseResult], status: str) -> str:
    count = len(group.members)
    cause = f'<p class="cause">{linked(group.cause)}</p>' if group.cause else ""
    severity = _severity({"severity": group.severity})
    return (
        f'<details class="group s-{escape(group.status or status)}" data-group="{group.key}"><summary>'
        f'<b class="n">{count}</b> {severity}'
        f'<span class="why">{escape(group.title or "(no reason given)")}</span>{_entries(group.entries)}</summary>'
        f'<div class="group-body">{cause}{patterns([cases[i].case_id for i in group.members])}'
        '<div class="rows"></div></div></details>'
    )


def _entries(entries: list[dict[str, str]]) -> str:
    """Each known-issue entry's traced cause, its upstream thread and where it is listed, after the group's title."""
    return "".join(f' <span class="entry">{cause_link(entry.get("link", ""))} '
                   f'{cause_link(entry.get("upstream", ""), "upstream")} {entry_key(entry.get("key", ""))}</span>'
                   for entry in entries)


def entry_key(key: str) -> str:
    """`known_issues.toml #12` as a link to the page's listing of that entry."""
    target = issue_anchor(key)
    text = escape(key)
    return f'<a class="entry-key muted" href="#{target}">{text}</a>' if target else f'<span class="muted">{text}</span>'


def issue_list(cases: list[CaseResult], unmatched: list[str]) -> str:
    """Every known-issue entry this run met, by key, with its links and how many cases it excused or names; then,
    as pytest lists the xfails nothing hit, the entries that matched no case (they excuse nothing here)."""
    met: dict[str, list] = {}
    for case in cases:
        for entry in case.known_issues:
            met.setdefault(entry.get("key", ""), [entry, 0])[1] += 1
    rows = "".join(
        f'<li id="{issue_anchor(key)}" class="issue-entry"><b>{escape(key)}</b> {_severity(entry)}'
        f'{escape(entry.get("title", ""))} {cause_link(entry.get("link", ""))} '
        f'{cause_link(entry.get("upstream", ""), "upstream")} '
        f'<span class="muted">({count} case{"" if count == 1 else "s"})</span></li>'
        for key, (entry, count) in sorted(met.items(), key=lambda item: (_RANK.get(item[1][0].get("severity"), 9),
                                                                        _number(item[0]))))
    listed = f'<ul class="issue-list">{rows}</ul>' if rows else '<p class="none">No entry applied to this run.</p>'
    return (f'<h3 id="issue-entries">Known-issue entries met ({len(met)})</h3>{listed}'
            f'<h3 id="issue-unmatched">Entries that matched no case ({len(unmatched)})</h3>{_unmatched(unmatched)}')


def _severity(entry: dict[str, str]) -> str:
    """An entry's kind of finding as a tag ("" for an entry from before severities)."""
    severity = entry.get("severity", "")
    return f'<span class="severity sev-{escape(severity.replace(" ", "-"))}">{escape(severity)}</span> ' if \
        severity else ""


def _unmatched(unmatched: list[str]) -> str:
    if not unmatched:
        return '<p class="none">Every entry of this release matched a case of this run.</p>'
    items = "".join(f'<li id="{issue_anchor(key)}" class="issue-unmatched"><b>{escape(key)}</b> <code>'
                    f"{escape(match)}</code></li>" for key, match in map(split_unmatched, unmatched))
    return ('<p class="muted">Like the xfails pytest lists as unused: these entries of known_issues.toml excused '
            f'nothing in this run (its plan may not reach them, or they no longer apply).</p><ul class="unmatched">'
            f"{items}</ul>")


def split_unmatched(text: str) -> tuple[str, str]:
    """results.json's `known_issues_unmatched` item ("known_issues.toml #12 <glob or tuple of globs>") as its key
    and its globs, a tuple written as a plain list."""
    head, sep, rest = text.partition("#")
    number, _, match = rest.partition(" ")
    if match.startswith("("):
        try:
            match = ", ".join(map(str, ast.literal_eval(match)))
        except (ValueError, SyntaxError):
            pass  # not a tuple after all: shown as written
    return (f"{head}#{number}", match) if sep else (text, "")


def _number(key: str) -> tuple[int, str]:
    tail = key.rpartition("#")[2]
    return (int(tail) if tail.isdigit() else 1 << 30, key)


def patterns(case_ids: list[str]) -> str:
    """A group's ids as exact brace patterns (idsets.compact), cut after PATTERN_CHARS characters."""
    items, length = [], 0
    pairs = compact(case_ids)
    for pattern, count in pairs:
        if items and length + len(pattern) > PATTERN_CHARS:
            break
        items.append(f"<li><code>{escape(pattern)}</code> ({count})</li>")
        length += len(pattern)
    more = len(pairs) - len(items)
    tail = f'<li class="muted">\u2026 and {more} more pattern{"s" if more > 1 else ""}</li>' if more else ""
    return f'<ul class="patterns" aria-label="which cases">{"".join(items)}{tail}</ul>'
