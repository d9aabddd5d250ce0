"""The records, embedded once in index.html as compact JSON that the page script renders from.

A full plan is 22,800 cases, three quarters of them SKIP rows that differ only in a few repeated strings, and
thousands of XFAIL rows with the same few reasons and tracebacks. So:

- a case is an array in the order of `fields` (CaseResult's own fields and the `cell` text: those every case has
  first, the others by how many cases have them, the id last), trailing empty fields dropped; the id is left out
  where the axes spell it (harness.report.axes);
- each text field has its own string table in `s`: text that repeats in the field is written as its index there,
  text that occurs once inline (the page reads a number in a text field as an index, a string as the text);
- a figure is [spec, value, limit, the share of its limit used], its spec ([name, label, 1 for the cell's figure],
  the same in every case of a kind) an index into `f`, its value, limit and ratio text written in Python
  (harness.core.figures.written), so the page formats no figure itself; a failed check is [check, subject, value,
  limit, the known issue (or expected refusal) that excuses it, the band it excuses], at most SHOWN_CHECKS of each
  check, then [check, "", "", "", "", "", how many more];
- a case's known-issue entries ({key, title, link}, the same in thousands of XFAIL cases) are indices into the value
  table `v`, a link kept only where a browser may follow it (detail.outside_link);
- each `extra` value is stored once in the value table `v` (pack.py); "other data" (the extra keys no part of the
  page draws) only for the cases that need a look: for the others only the names of those keys.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import fields
from typing import Any

from harness.core.results import TEXT, CaseResult
from harness.report import axes, pack
from harness.report.data import ANCHOR, ATTENTION, BAD, STATUSES
from harness.report.detail import issue_anchor, outside_link

_LEAD = ("status", "reason", "world_size")  # after the axes: what (nearly) every case has
FIELDS = (*dict.fromkeys((*axes.names(), *_LEAD, *(f.name for f in fields(CaseResult)), "cell")),)
CODED = (*TEXT, "cell", "figures", "evidence", "extra")  # the fields with a string table of their own
SHOWN_CHECKS = 10  # failed checks of one check embedded per case (each one's worst first); results.json has all
# The extra keys static/detail.js draws; the others are "other data".
DRAWN = frozenset({"traceback", "images", "blocks", "localization", "localization_error", "comms",
                   "peak_mem_mb_per_rank", "repro", "drift", "repeat"})


class Table:
    """Distinct values in order of first use; `index` returns a value's position, adding it if new."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._seen: dict[str, int] = {}

    def index(self, value: Any) -> int:
        key = value if isinstance(value, str) else "\0" + json.dumps(value, sort_keys=True, default=str)
        if key not in self._seen:
            self._seen[key] = len(self.values)
            self.values.append(value)
        return self._seen[key]

    def __contains__(self, value: Any) -> bool:
        return isinstance(value, str) and value in self._seen


class _Text(str):
    """Text of a field, written inline or as an index into the field's string table once every case is encoded."""

    field = ""

    @classmethod
    def of(cls, field: str, text: Any) -> _Text:
        out = cls("" if text is None else str(text))
        out.field = field
        return out


def order(cases: list[CaseResult]) -> list[str]:
    """FIELDS as a case's array has them: the axes and what every case has first, then the others by how many cases
    have them (so that a case's empty fields trail and are dropped), the id last (most cases leave it out)."""
    lead = [*axes.names(), *_LEAD]
    rest = [name for name in FIELDS if name not in lead and name != "case_id"]
    held = Counter(name for case in cases for name in rest if _held(case, name))
    return [*lead, *sorted(rest, key=lambda name: -held[name]), "case_id"]


def _held(case: CaseResult, name: str) -> bool:
    return bool(case.cell) if name == "cell" else getattr(case, name) not in (None, "", [], {})


def encode(cases: list[CaseResult], groups: dict[str, list[int]], values_help: dict | None = None,
           history: dict | None = None) -> dict[str, Any]:
    """The page's data: the axes and statuses it filters on, what their values mean (`help`, from the run's header:
    a flow's calls and position), the tables, one array per case, the groups, and what changed against a base run
    (`history`: {"changes": {case index: [kind, status there, cell there]}, "base": its folder})."""
    specs, values, names = Table(), Table(), order(cases)
    rows = [_row(case, names, specs, values) for case in cases]
    counts = Counter((text.field, str(text)) for row in rows for text in _texts(row))
    strings = {name: Table() for name in CODED}
    for (name, text), count in counts.items():
        if count > 1:
            strings[name].index(text)
    return {"axes": list(axes.axes()), "matrix": axes.matrix(), "fields": names, "text": [*TEXT, "cell"],
            "statuses": list(STATUSES), "bad": sorted(BAD), "attention": list(ATTENTION), "anchor": ANCHOR,
            "drawn": sorted(DRAWN), "help": values_help or {}, "changes": (history or {}).get("changes", {}),
            "base": (history or {}).get("base", ""),
            "s": {name: table.values for name, table in strings.items()}, "f": specs.values, "v": values.values,
            "c": [_resolve(row, strings) for row in rows], "g": groups}


def _row(case: CaseResult, names: list[str], specs: Table, values: Table) -> list[Any]:
    own = case.status.needs_a_look  # a case that needs a look: all its data
    row: list[Any] = []
    for name in names:
        if name == "case_id":
            spelt = axes.spell({axis: getattr(case, axis) for axis in axes.names()})
            value = None if case.case_id == spelt else _Text.of(name, case.case_id)
        elif name == "cell":
            value = _Text.of(name, case.cell) if case.figures else None
        elif name in TEXT:
            value = _Text.of(name, getattr(case, name)) if getattr(case, name) else None
        elif name == "figures":
            value = [_figure(figure, specs) for figure in case.figures] or None
        elif name == "evidence":
            value = _evidence(case.evidence) or None
        elif name == "extra":
            value = _extra(case.extra, values, own) or None
        elif name == "known_issues":
            value = [values.index(_entry(entry)) for entry in case.known_issues] or None
        else:
            value = pack.rounded(pack.finite(getattr(case, name)))
        row.append(value)
    return _trimmed(row)


def _entry(entry: dict[str, str]) -> dict[str, str]:
    """A known-issue entry as the page shows it: its key, its title, where the page lists it (`anchor`), its link
    and upstream thread where a browser may follow them, and its kind of finding."""
    key = str(entry.get("key", ""))
    return {"key": key, "title": str(entry.get("title", "")), "anchor": issue_anchor(key),
            "link": outside_link(entry.get("link")) or "", "upstream": outside_link(entry.get("upstream")) or "",
            "severity": str(entry.get("severity", ""))}


def _trimmed(row: list[Any]) -> list[Any]:
    while row and row[-1] in (None, ""):
        row.pop()
    return row


def _figure(figure: dict[str, Any], specs: Table) -> list[Any]:
    """[spec, value, limit, share of the limit used] with the texts written as the figure's format writes them."""
    name = figure.get("name", "")
    spec = specs.index([name, figure.get("label") or name, 1 if figure.get("cell") else 0])
    limit = figure.get("limit")
    out = [spec, _Text.of("figures", pack.written(figure))]
    if limit is not None:
        out += [_Text.of("figures", pack.written({**figure, "value": limit})),
                _Text.of("figures", pack.ratio(figure))]
    return _trimmed(out)


def _evidence(items: list[dict[str, Any]]) -> list[list[Any]]:
    """Each check's first SHOWN_CHECKS items (the worst, as the judge orders them), then how many more it has."""
    out, seen = [], Counter()
    for item in items:
        check = item.get("check") or ""
        seen[check] += 1
        if seen[check] <= SHOWN_CHECKS:
            excused = item.get("known") or (f"expected refusal: {item['refused']}" if item.get("refused") else None)
            texts = [item.get("check"), item.get("subject"), pack.number(item.get("value")),
                     pack.number(item.get("limit")), excused, pack.band(item.get("band"))]
            out.append(_trimmed([_Text.of("evidence", text) for text in texts]))
    for check, count in seen.items():
        if count > SHOWN_CHECKS:
            out.append([*(_Text.of("evidence", text) for text in (check, "", "", "", "", "")),
                        count - SHOWN_CHECKS])
    return out


def _extra(extra: dict[str, Any], values: Table, own: bool) -> list[Any]:
    """[key, value index, ...]; "other data" only when `own`, else its keys as one text at the end (an array of odd
    length); unsafe image paths dropped."""
    out: list[Any] = []
    left = [key for key in extra if key not in DRAWN and not own]
    for key, value in extra.items():
        value = pack.safe(key, value) if key not in left else None
        if value is not None:
            out += [_Text.of("extra", key), values.index(pack.packed(pack.finite(value), values))]
    return [*out, _Text.of("extra", ", ".join(left))] if left else out


def _texts(value: Any):
    if isinstance(value, _Text):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _resolve(value: Any, strings: dict[str, Table]) -> Any:
    """Each text as its index in its field's string table when it repeats there, else inline."""
    if isinstance(value, _Text):
        table = strings[value.field]
        return table.index(str(value)) if str(value) in table else str(value)
    if isinstance(value, list):
        return [_resolve(item, strings) for item in value]
    return value


def script_tag(data: dict[str, Any], element_id: str = "report-data") -> str:
    """A JSON <script> block: `<` is written as \\u003c, so no string in it can close the element."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'
