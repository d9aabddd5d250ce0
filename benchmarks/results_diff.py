"""Compare two results.json files case by case and figure by figure: typed `figures` against typed `figures`, or,
across the change of field layout (issue 24), the flat columns of before (`max_abs_err`, `ssim`, `loss_err`, ...
and scalars in `extra`) against the typed `figures` of after. Timings and memory are left out; everything else a
case reports is compared.

    python benchmarks/results_diff.py BEFORE/results.json AFTER/results.json

Prints what was compared and every difference; exits 1 when any case differs in status, reason or a figure.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# A figure of after whose value before held under another name: the train kind's weights error sat in the tensor
# column `max_abs_err`; an image case's comparison with its one-device twin in `extra.vs_baseline.*`.
RENAMED = {("train", "weight_max_abs_err"): "max_abs_err", ("image", "vs_baseline_max_abs"): "vs_baseline_max_abs_err"}
TIMINGS = {"seconds", "peak_mem_mb"}
REL = 1e-9  # the same run on the same machine gives the same numbers; only the printing may round


def _figures_before(case: dict) -> dict:
    scalars = {}
    for key, value in case.get("extra", {}).items():
        if isinstance(value, (int, float, str)):
            scalars[key] = value
        elif isinstance(value, dict):  # one level down, as `<outer>_<inner>`
            scalars.update({f"{key}_{inner}": item for inner, item in value.items() if isinstance(item, (int, float))})
    return {**scalars, **{key: value for key, value in case.items() if key not in ("extra", "evidence")}}


def _number(value):
    """After writes non-finite floats as "nan", "inf", "-inf" (JSON has none); before wrote NaN / Infinity."""
    return float(value) if value in ("nan", "inf", "-inf") else value


def _same(a, b) -> bool:
    a, b = _number(a), _number(b)
    if a == b:
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= REL * max(abs(a), abs(b), 1e-300)
    return a == b


def compare(before: list[dict], after: list[dict]) -> tuple[dict, list[str]]:
    old, new = {c["case_id"]: c for c in before}, {c["case_id"]: c for c in after}
    differences = [f"only before: {cid}" for cid in sorted(old.keys() - new.keys())]
    differences += [f"only after: {cid}" for cid in sorted(new.keys() - old.keys())]
    counted = {"cases": 0, "statuses": 0, "reasons": 0, "figures": 0, "evidence items": 0}
    for cid in sorted(old.keys() & new.keys()):
        a, b = old[cid], new[cid]
        counted["cases"] += 1
        for field in ("status", "reason", "first_divergence", "dispatched", "kernels", "comms"):
            if a.get(field) != b.get(field):
                differences.append(f"{cid}: {field} {a.get(field)!r} -> {b.get(field)!r}")
        counted["statuses"] += 1
        counted["reasons"] += 1
        typed = "figures" in a
        flat = {item["name"]: item["value"] for item in a["figures"]} if typed else _figures_before(a)
        for figure in b.get("figures", []):
            name = figure["name"]
            if name in TIMINGS:
                continue
            key = name if typed else RENAMED.get((b["kind"], name), name)
            if key not in flat:
                differences.append(f"{cid}: figure {name} is new (before had no {key})")
            elif not _same(flat[key], figure["value"]):
                differences.append(f"{cid}: figure {name} {flat[key]!r} -> {figure['value']!r}")
            counted["figures"] += 1
        strip = [{k: v for k, v in item.items() if k != "known"} for item in a.get("evidence", [])]
        if strip != [{k: v for k, v in item.items() if k != "known"} for item in b.get("evidence", [])]:
            differences.append(f"{cid}: evidence differs")
        counted["evidence items"] += len(a.get("evidence", []))
    return counted, differences


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-3].strip(), file=sys.stderr)
        return 2
    before, after = (json.loads(Path(path).read_text())["cases"] for path in argv)
    counted, differences = compare(before, after)
    print("compared: " + ", ".join(f"{count} {what}" for what, count in counted.items()))
    for line in differences:
        print("  " + line)
    print(f"{len(differences)} difference(s)")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
