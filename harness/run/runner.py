"""One `harness run`: plan, capture what is missing, launch by world size, judge, write the matrix."""

from __future__ import annotations

import datetime
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from harness.core import axes, environment
from harness.core.errors import HarnessError
from harness.core.header import RunHeader
from harness.core.modes import EAGER, MODES
from harness.core.records import GroupSpec, Localization, Outcome
from harness.core.reference import reference_path
from harness.core.results import CaseResult, Status, write_results
from harness.report import matrix
from harness.report.images import prune_images
from harness.report.write import write_reports
from harness.run import shards, timing
from harness.run.capture import ensure_references
from harness.run.known_issues import load_known_issues
from harness.run.launch import GroupStats, Nodes, group_by_world_size, run_group
from harness.run.launchers import OWN_OPTIONS, launcher_from
from harness.run.nodes import WORKDIR, SharedRun
from harness.run.plan import PlannedCase, build_plan, max_ranks, uncovered_rows
from harness.run.settings import Settings
from harness.run.twins import name_eager_twins
from harness.run.verdict import apply_expected_refusal, apply_known_issues, judge, not_run, note_repro

PARTIAL = "results.partial.jsonl"


@dataclass
class RunSummary:
    results: list[CaseResult]
    header: RunHeader
    exit_code: int


def plan_from(settings: Settings, fault: str | None = None) -> list[PlannedCase]:
    more = {axis.name: settings.option(axis.option) for axis in axes.product_axes()
            if axis.name not in ("backend", "dtype")}
    compiled = settings.compile_cases
    if "all" in more["mode"]:  # every mode on every case: the opt-in beyond the plan's compile slice
        more["mode"], compiled = list(MODES), ["*"]
    plan = build_plan(settings.models, settings.layouts, settings.backends, settings.dtypes, settings.shapes,
                      settings.cpu_max_ranks, fault, settings.kinds, settings.weights, settings.check_refusals,
                      settings.scopes, capacity=_capacity(settings), more=more, compile_cases=compiled)
    return plan + uncovered_rows()


def _capacity(settings: Settings):
    return max_ranks(settings.cpu_max_ranks, settings.nnodes, settings.gpus_per_node)


def run(settings: Settings, plan: list[PlannedCase], resume: bool = False,
        echo: Callable[[str], None] = print, capture_missing: bool = True, plan_s: float = 0.0,
        localize_failures: bool = True, purpose: str = "") -> RunSummary:
    """Run the plan; `plan_s` is how long making it took (counted in the wall time, as a user waits for it).
    `localize_failures`: localize every FAIL (the selftest's deliberate FAILs need not be; `--localize` still does
    every case). `purpose` says what the run is for in its header ("selftest": its FAILs are deliberate)."""
    started, clock = datetime.datetime.now().isoformat(timespec="seconds"), time.monotonic() - plan_s
    shard = shards.select(plan, settings.shard) if settings.shard else None
    plan = shard.plan if shard else plan
    report_dir = settings.path("report_dir")
    runnable = [p.case for p in plan if p.runs]
    metas = ensure_references(runnable, settings.path("references"), echo, capture_missing, settings)
    report_dir.mkdir(parents=True, exist_ok=True)  # only once the references are sound: no empty folder on an error
    issues = load_known_issues(settings.path("known_issues"))
    versions = _versions(metas)
    if versions["version_mismatch"]:  # said before the cases run too: every verdict below is against it
        echo(f"note: {versions['version_mismatch']}")
    fingerprint = _fingerprint(settings, versions, metas)
    done = _resume(report_dir, resume, echo, fingerprint)
    if not done:
        _clear_previous(report_dir, echo)
    todo = [case for case in runnable if case.case_id not in done]
    echo(f"plan: {len(plan)} cases, {len(runnable)} to run, {len(plan) - len(runnable)} skipped at plan time"
         + (f", {len(runnable) - len(todo)} kept from the interrupted run" if resume else ""))
    compiled = [mode for mode in settings.modes if mode != EAGER]
    if compiled and "all" not in compiled and settings.compile_cases != ["*"]:
        echo(f"{', '.join(compiled)}: the plan's compile slice only, {sum(p.case.mode != EAGER for p in plan)} "
             f"case(s) (--compile-cases '*' compiles every case of the plan; --modes all runs every mode)")
    refusals = {p.case.case_id: p.expected_refusal for p in plan if p.expected_refusal is not None}
    kept = len(done)
    try:
        stats = _launch_all(todo, settings, report_dir, issues, refusals, done, echo)
    except KeyboardInterrupt:
        echo(f"interrupted: {len(done) - kept} case(s) finished in this run" + (f", {kept} kept from before" if kept
                                                                                else "")
             + f"; {len(done)} of {len(runnable)} are in {report_dir / PARTIAL}"
             + (" (rerun with --resume to run the rest)" if done else " (nothing to resume)"))
        raise
    localizing = time.monotonic()
    _localize_all([case for case in todo if _to_localize(done[case.case_id], settings.localize, localize_failures)],
                  settings, report_dir, done, echo)
    localize_s = time.monotonic() - localizing
    results = [done.get(p.case.case_id) or not_run(p) for p in plan]
    name_eager_twins(results)
    header = _header(settings, versions, results, started, time.monotonic() - clock, stats.launches)
    header.shard = shard.header if shard is not None else None
    header.time_breakdown = timing.time_breakdown(results, stats.startup_s, header.wall_s, localize_s, plan_s)
    header.known_issues_unmatched = _unmatched(issues, results)
    header.purpose = purpose
    if settings.plan == "full" and header.known_issues_unmatched:  # the full plan is what the entries are for
        echo(f"note: {len(header.known_issues_unmatched)} known-issue entries matched no case of the full plan "
             f"(remove or fix them): {'; '.join(header.known_issues_unmatched)}")
    writing = time.monotonic()
    write_reports(report_dir, results, header.to_dict())
    header.time_breakdown["reports"] = round(time.monotonic() - writing, 2)  # known once they are written
    write_results(report_dir / "results.json", results, header.to_dict())
    (report_dir / PARTIAL).unlink(missing_ok=True)
    if header.version_mismatch:
        echo(f"note: {header.version_mismatch}")
    echo(matrix.terminal(results, page=str(report_dir / "index.html")))
    echo(f"reports: {report_dir / 'index.html'}, {report_dir / 'matrix.csv'}, {report_dir / 'matrix.md'}")
    echo(timing.time_line(header.time_breakdown))
    failed = any(r.status.is_failure(settings.xfail_strict) for r in results)
    unchecked = _no_parallel_ran(plan, results) and not settings.allow_no_parallel
    _tidy_work(report_dir / WORKDIR, settings, failed, echo)
    if unchecked:
        echo("WARNING: no case with more than one rank ran: every parallel layout of the plan was SKIP (see the "
             "reasons above), so this run checked no parallel parity at all. Exit 1; pass --allow-no-parallel if "
             "that is what you meant.")
    return RunSummary(results, header, 1 if failed or unchecked else 0)


def _tidy_work(workdir: Path, settings: Settings, failed: bool, echo) -> None:
    """The work folder (launch logs, rank events, the shared baselines) is only needed while the run lasts: removed
    after a run where every case ended well, kept (and said where) when a case failed, with --keep-work, or over
    several nodes (whose agents read it until they leave)."""
    if failed or settings.keep_work or settings.nnodes > 1:
        why = "a case failed" if failed else "--keep-work" if settings.keep_work else "several nodes read it"
        echo(f"work files kept in {workdir} ({why}): each launch's torchrun log and rank events")
        return
    shutil.rmtree(workdir, ignore_errors=True)


def _no_parallel_ran(plan: list[PlannedCase], results: list[CaseResult]) -> bool:
    """The plan asked for parallel layouts and none of its cases with more than one rank ran."""
    asked = any(p.case.world_size > 1 for p in plan)
    ran = any(r.world_size > 1 and r.status is not Status.SKIP for r in results)
    return asked and not ran


def _to_localize(result: CaseResult, every: bool, failures: bool = True) -> bool:
    """Every FAIL (unless `failures` is off); with --localize every case that produced numbers (a known issue that
    failed numerically too)."""
    if result.status is Status.FAIL:
        return failures or every
    numbers = result.status in (Status.PASS, Status.XPASS) or (
        result.status is Status.XFAIL and str(result.extra.get("observed", "")).startswith("FAIL"))
    return every and numbers


def _localize_all(cases, settings: Settings, report_dir: Path, done: dict, echo) -> None:
    """Rerun the cases to find where each breaks (one launch per world size); the status stays what it was."""
    if not cases:
        return
    echo(f"localizing {len(cases)} case(s): where each first leaves the single-device run")
    group = GroupSpec("", str(settings.path("references")), None, [])

    def on_outcome(outcome: Outcome) -> None:
        result, record = done[outcome.case.case_id], outcome.record
        result.extra["localize_s"] = record.seconds
        found = None if record.failed or record.timeout else (record.metrics or {}).get("localization")
        if found is None:
            result.extra["localization_error"] = record.error or "no result"
            result.first_divergence = f"not localized: {record.error or 'no result'}"
        else:
            found = Localization.from_dict(found)
            result.extra["localization"] = found.to_dict()
            result.first_divergence = found.summary + (f" ({found.untraced})" if found.untraced else "")
        echo(f"  {result.case_id}: {result.first_divergence}")

    for members in group_by_world_size(replace(case, localize=True) for case in cases).values():
        timeout = settings.case_timeout or _auto_timeout(members, settings.path("references"))
        run_group(members, group, report_dir / "work" / "localize", timeout, on_outcome)


def _launch_all(cases, settings: Settings, report_dir: Path, issues, refusals: dict, done: dict,
                echo) -> GroupStats:
    workdir = report_dir / WORKDIR
    shutil.rmtree(workdir, ignore_errors=True)
    total, stats = len(done) + len(cases), GroupStats()  # cases kept by --resume count as done
    group = GroupSpec("", str(settings.path("references")), str(report_dir / "images"), [],
                      baselines=str(workdir / "baselines"),
                      compile_cache=str(settings.path("compile_cache")) if settings.compile_cache else None)
    launcher = launcher_from(settings)
    with open(report_dir / PARTIAL, "a") as partial, _shared(launcher.nnodes, workdir) as shared:
        nodes = Nodes(launcher, _capacity(settings), shared)

        def on_outcome(outcome: Outcome) -> None:
            result = judge(outcome, settings)
            result = apply_known_issues(apply_expected_refusal(result, refusals.get(result.case_id)), issues)
            result = note_repro(result, outcome.case)
            prune_images(result, report_dir / "images", settings.images)
            done[result.case_id] = result
            partial.write(json.dumps(result.to_dict()) + "\n")
            partial.flush()
            echo(_progress_line(len(done), result, total))

        for world_size, members in group_by_world_size(cases).items():
            spans = nodes.nodes_for(world_size)
            echo(f"launching {len(members)} case(s) on {world_size} rank(s)" + (f" over {spans} nodes" if spans > 1
                                                                                else ""))
            timeout = settings.case_timeout or _auto_timeout(members, settings.path("references"))
            ran = run_group(members, group, workdir, timeout, on_outcome, nodes, echo)
            stats.launches += ran.launches
            stats.startup_s += ran.startup_s
    return stats


def _shared(nnodes: int, workdir: Path):
    """Node 0's side of a run over several nodes (the others follow it through `workdir`); nothing on one host."""
    import contextlib

    return SharedRun(workdir, nnodes) if nnodes > 1 else contextlib.nullcontext()


def _auto_timeout(cases, root: Path) -> float:
    """300 s, plus 60 s per GB of the largest reference's weights: a wide margin, since a hang is found by the
    stall detection (harness.run.launch) long before; this bound is for a group that spins without progress."""
    sizes = [reference_path(root, c.model, c.shape, c.kind).stat().st_size for c in cases
             if reference_path(root, c.model, c.shape, c.kind).exists()]
    return 300.0 + 60.0 * max(sizes, default=0) / 2**30


WIDTH = 120  # every line a run prints fits in this many columns


def _progress_line(index: int, result: CaseResult, total: int) -> str:
    number = f" {result.cell}" if result.cell else ""
    seconds = f" {result.seconds:.2f}s" if result.seconds is not None else ""
    line = f"[{index}/{total}] {result.status.value:7s} {result.case_id}{number}{seconds}"
    if result.reason and result.status is not Status.PASS:
        line += "  (" + " ".join(result.reason.split()) + ")"
    return _shorten(line)


def _shorten(text: str, limit: int = WIDTH) -> str:
    if len(text) <= limit:
        return text
    closing = ")" if text.endswith(")") else ""
    return text[: limit - 3 - len(closing)] + "..." + closing


def _clear_previous(report_dir: Path, echo) -> None:
    """A new run replaces the reports of the last one in this folder, PNGs included (none may outlive its case)."""
    if (report_dir / "results.json").exists():
        echo(f"note: replacing the previous run's reports in {report_dir} (--report-dir DIR keeps them)")
    shutil.rmtree(report_dir / "images", ignore_errors=True)


def _fingerprint(settings: Settings, versions: dict, metas: dict) -> str:
    """What a kept verdict depends on: the options (where the reports go and how long a case may take aside), the
    versions of this run and the references' checksums."""
    import hashlib

    # where and how it ran, not what it checks
    where = ("report_dir", "case_timeout", "keep_work", *OWN_OPTIONS, "gpus_per_node", "compile_cache")
    options = {key: value for key, value in settings.values.items() if key not in where}
    checksums = {"/".join(key): meta.get("checksum") for key, meta in sorted(metas.items())}
    payload = json.dumps([options, versions["environment"], checksums], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _resume(report_dir: Path, resume: bool, echo=print, fingerprint: str = "") -> dict[str, CaseResult]:
    """Finished cases of an interrupted run, when asked to resume and made under the same options, versions and
    references; otherwise start clean. The partial file's first line is that run's fingerprint."""
    path = report_dir / PARTIAL
    if not resume:
        path.unlink(missing_ok=True)
        path.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
        return {}
    if not path.exists():
        echo(f"note: nothing to resume in {report_dir} (no {PARTIAL}): running the whole plan")
        path.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
        return {}
    lines = path.read_text(errors="replace").splitlines()
    first = _json(lines[0]) if lines else None
    if not isinstance(first, dict) or first.get("fingerprint") != fingerprint:
        raise HarnessError(f"cannot --resume the run in {report_dir}: its options, diffusers/torch versions or "
                           "references differ from this run's (its verdicts would not be this run's); rerun without "
                           "--resume")
    kept = {}
    for line in lines[1:]:
        try:
            result = CaseResult.from_dict(json.loads(line))
        except (ValueError, TypeError):  # blank, or torn by a run killed mid-write: that case reruns
            continue
        kept[result.case_id] = result
    return kept


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _versions(metas) -> dict:
    """This run's environment, the references' (the first one's), and what differs between them."""
    here = environment.describe()
    reference_env = {}
    for meta in metas.values():
        reference_env = {key: meta.get(key) for key in here}
        break
    mismatch = [f"{key} {reference_env.get(key)} (references) vs {here[key]} (this run)"
                for key in ("torch", "diffusers", "diffusers_commit")
                if reference_env and reference_env.get(key) != here[key]]
    return {
        "environment": here,
        "reference_environment": reference_env,
        "version_mismatch": ("references come from another version: " + "; ".join(mismatch)) if mismatch else "",
    }


def _unmatched(issues, results: list[CaseResult]) -> list[str]:
    """Entries of the installed release that excused no evidence and named no passing case: evidence of nothing."""
    used = {key for r in results for key in r.extra.get("known_issue", ())}
    return [f"{issue.key} {issue.match}" for issue in issues if issue.covers() and issue.key not in used]


def _header(settings, versions, results, started, wall_s, launches) -> RunHeader:
    limits = {kind: settings.option(f"{kind}_limits") for kind in settings.kinds
              if f"{kind}_limits" in settings.kind_values}
    return RunHeader(versions["environment"], versions["reference_environment"], versions["version_mismatch"],
                     matrix.counts(results), dict(settings.values), limits, sorted({r.world_size for r in results}),
                     started, round(wall_s, 2), launches)
