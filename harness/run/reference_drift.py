"""What a case shows of its reference's one-device run (harness.engine.drift): a figure of its own, the module
trace behind it, and a line for the run's summary where one device moved off its stored reference. Not a check: a
moved model fails nothing a layout did, and every layout moves with it; it is a change of the model, the backend,
the compiler or torch, said as such however far inside the layouts' tolerance."""

from __future__ import annotations

import textwrap

from harness.core.figures import REFERENCE, FigureSpec
from harness.core.results import CaseResult
from harness.report.matrix import WIDTH

DRIFT = FigureSpec("reference_drift", "one device against its stored reference (module fingerprints, rel err)",
                   ".2g", role=REFERENCE)


def judge(result: CaseResult, metrics: dict) -> None:
    """The figure (its limit: the reference's own noise) and, under `drift`, what the page draws of it."""
    found = (metrics or {}).get("drift")
    if not found:
        return
    result.extra["drift"] = found
    if found.get("value") is not None:
        result.figures.append(DRIFT.of(found["value"], found["limit"], found.get("derived", "")))


def moved(result: CaseResult) -> str | None:
    """`forward: transformer_blocks.0.attn ...`: where one device first left the stored reference (None: it did not,
    or could not be compared)."""
    found = result.extra.get("drift") or {}
    line = found.get("line") or ""
    return None if not line or line.startswith(("none", "not localized")) else line


def said(result: CaseResult) -> str | None:
    """The one-device run against the stored reference in words: where it first left it, that it stayed on it, or
    why that is not known (None: not measured)."""
    found = result.extra.get("drift") or {}
    if found.get("absent") or found.get("error"):
        return f"one device against the stored reference not located: {found.get('absent') or found['error']}"
    if not found.get("line"):
        return None
    line = moved(result)
    return (f"one device first left the stored reference at {line} (limit: {found.get('derived', '')})" if line
            else f"one device on the stored reference ({found['line']})")


def summary_lines(results: list[CaseResult]) -> list[str]:
    """One line per reference that one device moved off (its model, shape and kind, once), and one for references
    that cannot be located (no fingerprints)."""
    lines, seen, absent = [], set(), set()
    for result in results:
        found = result.extra.get("drift") or {}
        if found.get("absent"):
            absent.add(f"{result.model}@{result.shape}")
        line = moved(result)
        if line is None or (result.model, result.shape, line) in seen:
            continue
        seen.add((result.model, result.shape, line))
        lines.append(f"one device moved off its stored reference: {result.model}@{result.shape} {result.kind}: "
                     f"rel err {found['value']:.2g} > {found['limit']:.2g} ({found.get('derived', '')}); first "
                     f"moved: {line}")
    if absent:
        lines.append(f"note: {len(absent)} reference(s) hold no module fingerprints ({', '.join(sorted(absent)[:4])}"
                     f"{'...' if len(absent) > 4 else ''}): where one device leaves them cannot be located")
    return [textwrap.fill(line, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
            for line in lines]  # as wide as the terminal's matrix

