"""Many case ids as a few exact brace patterns (`flux/{ring2,ring4}/native/fp32/tensor`), so a summary can name
hundreds of cases in one line and a reader can still expand each pattern back to precisely the ids it stands for."""

from __future__ import annotations

from collections.abc import Iterable

Group = tuple[tuple[str, ...], ...]  # one tuple of values per id component; the group is their cartesian product


def compact(case_ids: Iterable[str]) -> list[tuple[str, int]]:
    """(pattern, number of ids) pairs covering `case_ids` exactly once each, in order of first appearance.

    Groups merge along one id component at a time (the one that removes the most groups), and only where every
    other component is identical, so each pattern is an exact product: nothing outside the input matches it.
    """
    by_length: dict[int, list[Group]] = {}
    for case_id in dict.fromkeys(case_ids):
        parts = case_id.split("/")
        by_length.setdefault(len(parts), []).append(tuple((part,) for part in parts))
    out = []
    for groups in by_length.values():
        out += [(_pattern(group), _size(group)) for group in _merge(groups)]
    return out


def describe(case_ids: Iterable[str], limit: int = 400) -> str:
    """Patterns with counts as one Markdown line, cut after `limit` characters with how many patterns were left."""
    pairs = compact(case_ids)
    shown, length = [], 0
    for pattern, count in pairs:
        item = f"`{pattern}`" + (f" ({count})" if count > 1 else "")
        if shown and length + len(item) > limit:
            break
        shown.append(item)
        length += len(item) + 2
    rest = len(pairs) - len(shown)
    return ", ".join(shown) + (f", \u2026 and {rest} more pattern{'s' if rest > 1 else ''}" if rest else "")


def _merge(groups: list[Group]) -> list[Group]:
    while True:
        candidates = [_merge_along(groups, dim) for dim in range(len(groups[0]))] if groups else []
        best = min(candidates, key=len, default=groups)
        if len(best) >= len(groups):
            return groups
        groups = best


def _merge_along(groups: list[Group], dim: int) -> list[Group]:
    merged: dict[Group, list[str]] = {}
    for group in groups:
        key = group[:dim] + group[dim + 1:]
        merged.setdefault(key, []).extend(group[dim])
    return [key[:dim] + (tuple(values),) + key[dim:] for key, values in merged.items()]


def _pattern(group: Group) -> str:
    return "/".join(values[0] if len(values) == 1 else "{" + ",".join(values) + "}" for values in group)


def _size(group: Group) -> int:
    size = 1
    for values in group:
        size *= len(values)
    return size
