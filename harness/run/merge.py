"""`harness merge DIR...`: the reports of the N parts of a `--shard K/N` run as one run: one results.json, one
matrix, one HTML page (and `harness report --compare` reads it like any other run).

Every part's results.json carries the whole plan and which part each case belongs to, so a merge can prove that
every planned case came back exactly once, and name what a missing or unfinished part lacks.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.core import coverage
from harness.core.errors import HarnessError
from harness.core.header import RunHeader
from harness.core.results import RESULTS_FILE, CaseResult, read_results
from harness.report import matrix
from harness.report.idsets import describe
from harness.report.write import write_reports
from harness.run.shards import digest
from harness.run.timing import time_breakdown
from harness.run.twins import name_eager_twins

PASS_PARTS = "merge the folders that `harness run --shard K/N` wrote"  # what to do when a folder given is not a part


@dataclass
class Part:
    folder: Path
    header: RunHeader
    results: list[CaseResult]

    @property
    def shard(self) -> dict:
        return self.header.shard

    @property
    def name(self) -> str:
        return f"part {self.shard['index']}/{self.shard['count']} ({self.folder})"


def merge_runs(folders: list[Path], out_dir: Path) -> tuple[list[CaseResult], RunHeader]:
    """Read every part, check that together they hold each planned case exactly once, and write the merged reports
    to `out_dir`; nothing is written when a check fails (a HarnessError that names the parts and the cases)."""
    parts = [_read(Path(folder)) for folder in folders]
    if Path(out_dir).resolve() in {part.folder.resolve() for part in parts}:
        raise HarnessError(f"--report-dir {out_dir} is one of the parts; write the merged run to another folder")
    plan = _check_same_plan(parts)
    by_id = _check_each_case_once(parts, plan)
    results = [by_id[case_id] for case_id in plan]
    name_eager_twins(results)  # a twin that was another part's is in the merged run
    header = _header(parts, results)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_images(parts, out_dir / "images")
    write_reports(out_dir, results, header)
    return results, header


def _read(folder: Path) -> Part:
    header, results = read_results(folder / RESULTS_FILE, PASS_PARTS + " (their --report-dir)")
    if not isinstance(header.shard, dict):
        raise HarnessError(f"{folder}: not a part of a sharded run (its results.json has no shard header); "
                           + PASS_PARTS)
    return Part(folder, header, results)


def _check_same_plan(parts: list[Part]) -> list[str]:
    first = parts[0].shard
    seen: dict[int, Part] = {}
    for part in parts:
        shard = part.shard
        if shard["count"] != first["count"] or shard["plan_digest"] != first["plan_digest"] \
                or digest(shard["plan"]) != shard["plan_digest"]:
            raise HarnessError(f"{part.name} was cut from another plan than {parts[0].name}: run every part with the "
                               "same options, versions and references")
        if shard["index"] in seen:
            raise HarnessError(f"part {shard['index']}/{shard['count']} given twice: {seen[shard['index']].folder} "
                               f"and {part.folder}")
        seen[shard["index"]] = part
    return first["plan"]


def _check_each_case_once(parts: list[Part], plan: list[str]) -> dict[str, CaseResult]:
    """Every planned case in exactly one part, and no case the plan does not have."""
    shard, found, owner, problems = parts[0].shard, {}, {}, []
    part_of = dict(zip(plan, shard["part"], strict=True))
    twice = []
    for part in parts:
        for result in part.results:
            if result.case_id in found:
                twice.append(result.case_id)
            found[result.case_id], owner[result.case_id] = result, part
    if twice:
        problems.append(f"{len(twice)} case(s) come from two parts: {describe(twice)}")
    foreign = [case_id for case_id in found if case_id not in part_of]
    if foreign:
        problems.append(f"{len(foreign)} case(s) that the plan does not have: {describe(foreign)}")
    given = {part.shard["index"]: part for part in parts}
    for index in range(1, shard["count"] + 1):
        lacking = [case_id for case_id in plan if part_of[case_id] == index and case_id not in found]
        if not lacking:
            continue
        which = f"{given[index].name} lacks" if index in given else \
            f"part {index}/{shard['count']} is missing (no folder given holds it):"
        problems.append(f"{which} {len(lacking)} planned case(s): {describe(lacking)}")
    if problems:
        raise HarnessError("cannot merge: every planned case must come from exactly one part; " + "; ".join(problems))
    return found


def _header(parts: list[Part], results: list[CaseResult]) -> RunHeader:
    """The first part's environment and settings, this run's counts, and what each part took: the wall is the
    longest part's (the parts ran side by side), the time breakdown their sum (machine time)."""
    first = parts[0].header
    wall = max(part.header.wall_s for part in parts)
    startups = sum(part.header.time_breakdown.get("launch start-ups", 0.0) for part in parts)
    unmatched = [set(part.header.known_issues_unmatched) for part in parts]
    header = RunHeader(first.environment, first.reference_environment, first.version_mismatch,
                       matrix.counts(results), {**first.settings, "shard": ""}, first.limits,
                       sorted({result.world_size for result in results}), min(part.header.started for part in parts),
                       wall, sum(part.header.launches for part in parts),
                       known_issues_unmatched=sorted(set.intersection(*unmatched)) if unmatched else [],
                       merged_from=[{"folder": str(part.folder), "shard": f"{part.shard['index']}/"
                                     f"{part.shard['count']}", "cases": len(part.results),
                                     "wall_s": part.header.wall_s} for part in parts])
    header.time_breakdown = time_breakdown(results, startups, sum(part.header.wall_s for part in parts))
    header.values_help = {axis: {value: text for part in parts for value, text in part.header.values_help.get(
        axis, {}).items()} for axis in {axis for part in parts for axis in part.header.values_help}}
    covered = coverage.merge([found for part in parts if (found := coverage.read(part.header))])
    header.coverage = covered.to_dict() if covered is not None else None
    return header


def _copy_images(parts: list[Part], images: Path) -> None:
    """Every part's PNGs beside the merged page (a case's files come from its one part; thumbnails are named after
    their content, so two parts' copies of one are the same file)."""
    shutil.rmtree(images, ignore_errors=True)
    for part in parts:
        if (part.folder / "images").is_dir():
            shutil.copytree(part.folder / "images", images, dirs_exist_ok=True)
