"""What index.html says before anything else: the verdict in one word, and what was asked of the run (its world
sizes, its plan, whether coverage was measured), so a reviewer need not open Settings to know what ran; and, where
the coverage section would be, that it was not measured."""

from __future__ import annotations

from html import escape

from harness.core.header import RunHeader
from harness.core.results import CaseResult
from harness.report.coverage import ANCHOR as COVERAGE_ANCHOR
from harness.report.data import BAD, standing, standing_text

__all__ = ["no_coverage", "setup_line", "stands_on", "verdict"]


def verdict(header: RunHeader, counts: dict[str, int]) -> str:
    """The run in one word, first: FAIL when a case needs fixing, INCOMPLETE when the run stopped early, EMPTY
    without cases, else PASS (known issues and skips do not fail a run)."""
    if header.incomplete:
        word = "INCOMPLETE"
    elif any(counts.get(status) for status in BAD):
        word = "FAIL"
    else:
        word = "PASS" if sum(counts.values()) else "EMPTY"
    style = {"INCOMPLETE": "ERROR", "EMPTY": "SKIP"}.get(word, word)
    return f'<span class="verdict badge s-{style}" id="verdict">{word}</span>'


def stands_on(cases: list[CaseResult]) -> str:
    """What the verdict stands on, beside it: the failures the run found (none known), then the known issues it
    excused by kind, the silently wrong ones first, and the refusals diffusers made as expected (data.standing)."""
    counts = standing(cases)
    if not cases:
        return ""
    return (f'<p class="stands-on" id="stands-on"><b>{"Passes on" if not counts["failures"] else "Fails on"}</b> '
            f'{escape(standing_text(counts))} <a href="#known-issues">(listed below, most severe first)</a></p>')


def setup_line(header: RunHeader, cases: list[CaseResult]) -> str:
    """What was asked, in the first screen: the world sizes, the plan and whether coverage was measured."""
    settings = header.settings if isinstance(header.settings, dict) else {}
    sizes = header.world_sizes or sorted({int(c.world_size or 1) for c in cases})
    parts = [f"<b>world sizes</b> {escape(', '.join(str(size) for size in sizes) or '-')}"]
    if settings.get("plan"):
        parts.append(f"<b>plan</b> {escape(str(settings['plan']))}")
    measured = "measured" if header.coverage else "not measured (run with --coverage)"
    parts.append(f'<b>coverage</b> <a href="#{COVERAGE_ANCHOR}">{measured}</a>')
    return f'<p class="env-line" id="setup-line">{" &middot; ".join(parts)}</p>'


def no_coverage() -> str:
    """Where the coverage section would be, a run without --coverage says so rather than leaving it out."""
    return (f'<section id="{COVERAGE_ANCHOR}"><h2>Coverage of diffusers\' parallel code</h2><p class="none">'
            "Not measured: this run did not use <code>--coverage</code>, which runs every rank under coverage.py "
            "and reports the statements of diffusers' parallel code the cases executed.</p></section>")
