"""Where a run's wall time went, against its floor (what a run cannot go below without changing what a case
does); `harness run` and `harness merge` both report it."""

from __future__ import annotations

import json
import os

from harness.core.results import CaseResult

# "forward" is the case's run with the proof's recording in it (harness.rank.recorder)
# A file each finished run appends its breakdown to, one JSON line: how benchmarks/bench_tests.py sums where the
# test command's time goes without knowing where each test writes its reports.
TIME_LOG = "HARNESS_TIME_LOG"
# "repeat" is the case's second run, which the repeat check compares bit for bit with its first (harness.engine.repeat)
PHASES = ("reference loading", "model build", "parallel setup", "forward", "repeat", "baselines", "metrics and images",
          "gathers")


def time_breakdown(results: list[CaseResult], startup_s: float, wall_s: float,
                   localize_s: float = 0.0, plan_s: float = 0.0) -> dict:
    """Where the wall time went: making the plan, launch start-ups, rank 0's phases summed over the cases,
    localization (its own launches, apart), and the rest (capture, judging, waiting); the floor is start-ups plus
    the cases' own time (`seconds`, and the second run of the repeat check), which a run cannot go below without
    changing what a case does."""
    phases = {name: 0.0 for name in PHASES}
    for result in results:
        for name, seconds in (result.extra.get("phases") or {}).items():
            phases[name] = phases.get(name, 0.0) + seconds
    floor = startup_s + sum(result.seconds or 0.0 for result in results) + phases["repeat"]
    accounted = startup_s + sum(phases.values()) + localize_s + plan_s
    return {"wall": round(wall_s, 2), "start-up and plan": round(plan_s, 2), "launch start-ups": round(startup_s, 2),
            **{name: round(value, 2) for name, value in phases.items()}, "localization": round(localize_s, 2),
            "other (capture, judging, waits)": round(max(wall_s - accounted, 0.0), 2),
            "floor": round(floor, 2), "ratio to floor": round(wall_s / floor, 2) if floor > 0 else None}


def time_line(breakdown: dict, width: int) -> str:
    """One terminal line within `width`: the wall, the floor and as many of the biggest parts as fit."""
    parts = sorted(((name, value) for name, value in breakdown.items()
                    if name not in ("wall", "floor", "ratio to floor") and value), key=lambda item: -item[1])
    for count in range(min(len(parts), 6), -1, -1):
        shown = ", ".join(f"{name} {value:.0f}s" for name, value in parts[:count])
        line = (f"time: {breakdown['wall']:.0f}s wall" + (f" ({shown})" if shown else "") +
                f"; floor {breakdown['floor']:.0f}s" + (f", {breakdown['ratio to floor']}x"
                                                         if breakdown['ratio to floor'] is not None else ""))
        if len(line) <= width:
            return line
    return line


def log_breakdown(breakdown: dict, launches: int) -> None:
    """Append the breakdown to `$HARNESS_TIME_LOG` when it is set; one short write, so runs that share the file
    (benchmarks/bench_tests.py points it at one file per test) do not interleave their lines."""
    path = os.environ.get(TIME_LOG)
    if path:
        with open(path, "a") as log:
            log.write(json.dumps({"launches": launches, "time_breakdown": breakdown}) + "\n")
