"""What each value of the axes a case id leaves out by default means, for the report: a flow's calls and whether they
come before or after `enable_parallelism`, a load's, a mode's. Written into results.json's header by the run
(`RunHeader.values_help`), so the page (which imports no registry) can title its rows and columns with them."""

from __future__ import annotations

from harness.core.modes import MODES
from harness.core.results import CaseResult


def values_help(results: list[CaseResult]) -> dict[str, dict[str, str]]:
    """{axis: {value: what it means}} for the flow, load and mode values the results hold (the defaults included)."""
    from harness.flows import VALUES
    from harness.loads import LOADS

    described = {"flow": {}, "load": {}, "mode": {}}
    for axis, table in described.items():
        for name in dict.fromkeys(getattr(result, axis) for result in results):
            text = {"flow": _flow, "load": lambda n: _help(LOADS.get(n)), "mode": lambda n: _help(MODES.get(n))}[
                axis](VALUES.get(name) if axis == "flow" else name)
            if text:
                table[name] = text
    return {axis: table for axis, table in described.items() if table}


def _flow(value) -> str:
    if value is None:
        return ""
    if value.flow is None:
        return "nothing called around enable_parallelism"
    return (f"{value.flow.help}; called {value.position} enable_parallelism (the one-device run it is judged against "
            "makes the same calls)")


def _help(entry) -> str:
    return str(getattr(entry, "help", "") or "")
