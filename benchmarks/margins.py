"""How close the passing parallel low-precision cases of a run come to their limits: per kind, dtype and limited
figure, the tightest case (the margins table of docs/judging.md).

    python benchmarks/margins.py reports/results.json [--dtypes bf16,fp16] [--markdown]

Usage of a limit: value / limit for a figure held below its limit; the deficit below 1 over the limit's for SSIM
(held above); the PSNR's dB above its limit (held above; reported as dB of headroom). 1.0 means at the limit.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from harness.core.results import Status, read_results

ABOVE = {"ssim", "vs_baseline_ssim"}  # held above their limit, deficit below 1
DECIBELS = {"psnr", "vs_baseline_psnr"}  # held above their limit, in dB


@dataclass
class Tightest:
    cases: int = 0
    usage: float = -math.inf
    case_id: str = ""

    def see(self, usage: float, case_id: str) -> None:
        self.cases += 1
        if usage > self.usage:
            self.usage, self.case_id = usage, case_id


def usage(name: str, value: float, limit: float) -> float | None:
    """How much of its limit a figure uses (None when it cannot say: a zero limit)."""
    if name in DECIBELS:
        return -(value - limit)  # the headroom in dB, negated so that the tightest is the largest
    if name in ABOVE:
        return (1 - value) / (1 - limit) if limit < 1 else None
    return value / limit if limit else None


def margins(path: Path, dtypes: set[str]) -> dict[tuple[str, str, str], Tightest]:
    _, cases = read_results(path)
    table: dict[tuple[str, str, str], Tightest] = {}
    for case in cases:
        if case.status != Status.PASS or case.dtype not in dtypes or case.world_size == 1:
            continue
        for figure in case.figures:
            value, limit = figure.get("value"), figure.get("limit")
            if not isinstance(value, (int, float)) or not isinstance(limit, (int, float)):
                continue
            used = usage(figure["name"], float(value), float(limit))
            if used is not None and math.isfinite(used):
                key = (case.kind, case.dtype, figure["name"])
                table.setdefault(key, Tightest()).see(used, case.case_id)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--dtypes", default="bf16,fp16")
    args = parser.parse_args()
    table = margins(args.results, set(args.dtypes.split(",")))
    print("| kind | dtype | figure | PASS cases | tightest | case |")
    print("|---|---|---|---|---|---|")
    for (kind, dtype, name), tight in sorted(table.items()):
        shown = f"{-tight.usage:+.1f} dB above" if name in DECIBELS else f"{tight.usage:.2f} of the limit"
        print(f"| {kind} | {dtype} | `{name}` | {tight.cases} | {shown} | `{tight.case_id}` |")


if __name__ == "__main__":
    main()
