"""Compare two results.json files case by case and figure by figure, read as the records `harness run` wrote them
from (harness.core.results): status, reason, first divergence, dispatched backends, kernels, collectives, every
evidence item (without the known issue that excused it) and every figure. Timings and memory are left out.

    python benchmarks/results_diff.py BEFORE/results.json AFTER/results.json

Prints what was compared and every difference; exits 1 when any case differs in status, reason or a figure. Files
from before the kinds owned their figures (flat figure columns) are not read: their comparison with the typed figures
was done then (docs/architecture.md).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.results import CaseResult, Status, read_results

FIELDS = ("status", "reason", "first_divergence", "dispatched", "kernels", "comms")
TIMINGS = {"seconds", "peak_mem_mb"}
REL = 1e-9  # the same run on the same machine gives the same numbers; only the printing may round


def _number(value):
    """results.json writes non-finite floats as "nan", "inf", "-inf" (JSON has none)."""
    return float(value) if value in ("nan", "inf", "-inf") else value


def _same(a, b) -> bool:
    a, b = _number(a), _number(b)
    if a == b:
        return True
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= REL * max(abs(a), abs(b), 1e-300)
    return False


def _plain(value):
    """A status as its text (as results.json writes it); anything else as it is."""
    return value.value if isinstance(value, Status) else value


def _evidence(case: CaseResult) -> list[dict]:
    return [{key: value for key, value in item.items() if key != "known"} for item in case.evidence]


def compare(before: list[CaseResult], after: list[CaseResult]) -> tuple[dict, list[str]]:
    old, new = {c.case_id: c for c in before}, {c.case_id: c for c in after}
    differences = [f"only before: {cid}" for cid in sorted(old.keys() - new.keys())]
    differences += [f"only after: {cid}" for cid in sorted(new.keys() - old.keys())]
    counted = {"cases": 0, "statuses": 0, "reasons": 0, "figures": 0, "evidence items": 0}
    for cid in sorted(old.keys() & new.keys()):
        a, b = old[cid], new[cid]
        counted["cases"] += 1
        for field in FIELDS:
            was, now = _plain(getattr(a, field)), _plain(getattr(b, field))
            if was != now:
                differences.append(f"{cid}: {field} {was!r} -> {now!r}")
        counted["statuses"] += 1
        counted["reasons"] += 1
        had, has = ({figure["name"] for figure in case.figures} - TIMINGS for case in (a, b))
        differences += [f"{cid}: figure {name} is gone" for name in sorted(had - has)]
        for figure in b.figures:
            name = figure["name"]
            if name in TIMINGS:
                continue
            if name not in had:
                differences.append(f"{cid}: figure {name} is new")
            elif not _same(a.figure(name), figure["value"]):
                differences.append(f"{cid}: figure {name} {a.figure(name)!r} -> {figure['value']!r}")
            counted["figures"] += 1
        if _evidence(a) != _evidence(b):
            differences.append(f"{cid}: evidence differs")
        counted["evidence items"] += len(a.evidence)
    return counted, differences


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    try:
        before, after = (read_results(Path(path), "pass the results.json of two runs")[1] for path in argv)
    except HarnessError as error:
        print(f"results_diff: {error}", file=sys.stderr)
        return 2
    counted, differences = compare(before, after)
    print("compared: " + ", ".join(f"{count} {what}" for what, count in counted.items()))
    for line in differences:
        print("  " + line)
    print(f"{len(differences)} difference(s)")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
