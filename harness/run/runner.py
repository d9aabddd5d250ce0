"""One `harness run`: plan, capture what is missing, launch by world size, judge, write the matrix."""

from __future__ import annotations

import datetime
import json
import shutil
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness import flows
from harness.core import axes, environment
from harness.core.applicability import NotApplicable
from harness.core.errors import HarnessError
from harness.core.header import RunHeader
from harness.core.modes import EAGER, MODES
from harness.core.records import GroupSpec, Localization, Outcome
from harness.core.reference import reference_path
from harness.core.results import RESULTS_FILE, CaseResult, Status, write_results
from harness.kinds import kind_of, known_checks
from harness.loads import LOADS
from harness.report import matrix
from harness.report.images import prune_images
from harness.report.write import write_reports
from harness.run import axis_help, handover, ops, partial, reference_drift, shards, timing, warm
from harness.run import coverage as coverage_run
from harness.run.capture import ensure_references
from harness.run.checkpoints import FOLDER, write_checkpoints
from harness.run.divergence import first_divergence
from harness.run.folders import compile_cache_folder, launches_folder
from harness.run.known_issues import load_known_issues
from harness.run.launch import GroupStats, Nodes, group_by_world_size, run_group
from harness.run.launchers import launcher_from, node_env
from harness.run.lock import report_folder_lock
from harness.run.nodes import SharedRun
from harness.run.partial import PARTIAL
from harness.run.plan import PlannedCase, build_plan, max_ranks, uncovered_rows
from harness.run.settings import Settings, auto_case_timeout
from harness.run.twins import name_eager_twins
from harness.run.verdict import apply_expected_refusal, apply_known_issues, judge, not_run, note_repro


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
    if "all" in more["load"]:  # every load of the plan's load slice
        more["load"] = list(LOADS)
    if "all" in more["flow"]:  # every flow, both positions, on the plan's flow slice
        more["flow"] = list(flows.VALUES)
    plan = build_plan(settings.models, settings.layouts, settings.backends, settings.dtypes, settings.shapes,
                      settings.cpu_max_ranks, fault, settings.kinds, settings.weights, settings.check_refusals,
                      settings.scopes, capacity=_capacity(settings), more=more, compile_cases=compiled,
                      load_cases=settings.load_cases, flow_cases=settings.flow_cases)
    return plan + uncovered_rows()


def _capacity(settings: Settings):
    return max_ranks(settings.cpu_max_ranks, settings.nnodes, settings.gpus_per_node)


def run(settings: Settings, plan: list[PlannedCase], resume: bool = False,
        echo: Callable[[str], None] = print, capture_missing: bool = True, plan_s: float = 0.0,
        localize_failures: bool = True, purpose: str = "", command: list[str] | None = None) -> RunSummary:
    """Run the plan; `plan_s` is how long making it took (counted in the wall time, as a user waits for it).
    `localize_failures`: localize every FAIL (the selftest's deliberate FAILs need not be; `--localize` still does
    every case). `purpose` says what the run is for in its header ("selftest": its FAILs are deliberate). The report
    folder is this run's alone while it lasts (`command` is how the lock names it to a second run)."""
    clock = time.monotonic() - plan_s
    shard = shards.select(plan, settings.shard) if settings.shard else None
    run = _Run(settings, shard.plan if shard else plan, shard, echo, purpose, plan_s, clock)
    with report_folder_lock(run.report_dir, command):  # a folder left empty by a refused run goes again
        return run.start(resume, capture_missing, localize_failures)


@dataclass
class _Run:
    """One run's state between its phases, so that a run that stops at an internal error can hand over."""

    settings: Settings
    plan: list[PlannedCase]
    shard: shards.Shard | None
    echo: Callable[[str], None]
    purpose: str
    plan_s: float
    clock: float
    started: str = field(default_factory=lambda: datetime.datetime.now().isoformat(timespec="seconds"))
    done: dict[str, CaseResult] = field(default_factory=dict)  # finished cases, kept ones included
    issues: list = field(default_factory=list)  # known_issues.toml's entries
    versions: dict = field(default_factory=dict)  # this run's environment and the references' (`_versions`)
    measure: coverage_run.Measure | None = None  # `--coverage`: what the ranks measure
    kept: int = 0  # cases `--resume` kept from the interrupted run (not run, so not measured, by this one)

    @property
    def report_dir(self) -> Path:
        return self.settings.path("report_dir")

    def start(self, resume: bool, capture_missing: bool, localize_failures: bool) -> RunSummary:
        settings, plan, echo, report_dir = self.settings, self.plan, self.echo, self.report_dir
        runnable = [p.case for p in plan if p.runs]
        if runnable and forked(settings):  # its imports overlap the references' check
            warm.shared().prepare(node_env(0))
        metas = ensure_references(runnable, settings.path("references"), echo, capture_missing, settings)
        self.issues = load_known_issues(settings.path("known_issues"))
        self.versions = versions = _versions(metas)
        if versions["version_mismatch"]:  # said before the cases run too: every verdict below is against it
            echo(f"note: {versions['version_mismatch']}")
        self.done = done = partial.resume(report_dir, resume, echo, partial.fingerprint(settings, versions, metas))
        if not done:
            _clear_previous(report_dir, echo)
        todo = [case for case in runnable if case.case_id not in done]
        absent = sum(isinstance(p.skip_reason, NotApplicable) for p in plan)
        echo(f"plan: {len(plan)} cases, {len(runnable)} to run, {len(plan) - len(runnable) - absent} skipped at plan "
             f"time, {absent} not applicable (N/A)"
             + (f", {len(runnable) - len(todo)} kept from the interrupted run" if resume else ""))
        compiled = [mode for mode in settings.modes if mode != EAGER]
        if compiled and "all" not in compiled and settings.compile_cases != ["*"]:
            echo(f"{', '.join(compiled)}: the plan's compile slice only, {sum(p.case.mode != EAGER for p in plan)} "
                 f"case(s) (--compile-cases '*' compiles every case of the plan; --modes all runs every mode)")
        refusals = {p.case.case_id: p.expected_refusal for p in plan if p.expected_refusal is not None}
        kept = self.kept = len(done)
        has_flows = any(case.flow != flows.NONE for case in todo)
        self.measure = coverage_run.prepare(settings.coverage, launches_folder(report_dir), has_flows)
        try:
            stats = _launch_all(todo, settings, report_dir, self.issues, refusals, done, echo, self.measure)
            localizing = time.monotonic()
            for result in done.values():
                if result.status is Status.FAIL and _of_one_device(result):
                    result.first_divergence = ("not localized: what failed is measured on one device alone (" +
                                               ", ".join(sorted({item["check"] for item in result.evidence})) + ")")
            _localize_all([case for case in todo
                           if _to_localize(done[case.case_id], settings.localize, localize_failures)],
                          settings, report_dir, done, echo, self.measure)
            return self.finish(stats, time.monotonic() - localizing)
        except KeyboardInterrupt:
            before = f", {kept} kept from before" if kept else ""
            echo(f"interrupted: {len(done) - kept} case(s) finished in this run{before}; {len(done)} of "
                 f"{len(runnable)} are in {report_dir / PARTIAL}"
                 + (" (rerun with --resume to run the rest)" if done else " (nothing to resume)"))
            raise
        except HarnessError:
            raise
        except Exception as error:  # noqa: BLE001 - a bug of the harness itself: hand over what is done
            raise self.hand_over(error) from error

    def results(self, cause: str | None = None) -> list[CaseResult]:
        """Every planned case: judged, decided at plan time, or (a stopped run) not finished, saying why."""
        results = []
        for planned in self.plan:
            result = self.done.get(planned.case.case_id)
            if result is None:
                result = not_run(planned) if not planned.runs or cause is None else \
                    handover.unfinished(not_run(planned), cause)
            results.append(result)
        name_eager_twins(results)
        return results

    def header(self, results: list[CaseResult], stats: GroupStats, localize_s: float) -> RunHeader:
        settings = self.settings
        header = _header(settings, self.versions, results, self.started, time.monotonic() - self.clock,
                         stats.launches)
        header.shard = self.shard.header if self.shard is not None else None
        header.time_breakdown = timing.time_breakdown(results, stats.startup_s, header.wall_s, localize_s,
                                                      self.plan_s)
        header.known_issues_unmatched = _unmatched(self.issues, results)
        header.purpose = self.purpose
        header.values_help = axis_help.values_help(results)
        return header

    def finish(self, stats: GroupStats, localize_s: float) -> RunSummary:
        settings, echo, report_dir = self.settings, self.echo, self.report_dir
        results = self.results()
        if settings.localize_ops:  # the first op that moved inside the first module one device left its reference at
            ops.localize_ops(results, settings.path("references"), echo)
        header = self.header(results, stats, localize_s)
        if self.measure is not None:  # read once, from every rank process's data, before the work folder goes
            measured = coverage_run.report(self.measure, results, self.versions["environment"], self.kept)
            header.coverage = measured.to_dict()
            echo(measured.summary())
        if settings.plan == "full" and header.known_issues_unmatched:  # the full plan is what the entries are for
            echo(f"note: {len(header.known_issues_unmatched)} known-issue entries matched no case of the full plan "
                 f"(remove or fix them): {'; '.join(header.known_issues_unmatched)}")
        writing = time.monotonic()
        write_reports(report_dir, results, header)
        header.time_breakdown["reports"] = round(time.monotonic() - writing, 2)  # known once they are written
        write_results(report_dir / RESULTS_FILE, results, header)
        timing.log_breakdown(header.time_breakdown, header.launches)
        (report_dir / PARTIAL).unlink(missing_ok=True)
        if header.version_mismatch:
            echo(f"note: {header.version_mismatch}")
        echo(matrix.terminal(results, page=str(report_dir / "index.html")))
        if any(result.rank_death for result in results):
            echo(_rank_deaths_line(results))
        for line in reference_drift.summary_lines(results):  # one device off its stored reference: a change
            echo(line)
        echo(f"reports: {report_dir / 'index.html'}, {report_dir / 'matrix.csv'}, {report_dir / 'matrix.md'}")
        echo(timing.time_line(header.time_breakdown, matrix.WIDTH))
        failed = any(r.status.is_failure(settings.xfail_strict) for r in results)
        unchecked = _no_parallel_ran(self.plan, results) and not settings.allow_no_parallel
        _tidy_work(launches_folder(report_dir), settings, failed, echo, any(r.rank_death for r in results))
        if unchecked:
            echo("WARNING: no case with more than one rank ran: every parallel layout of the plan was SKIP or N/A "
                 "(see the reasons above), so this run checked no parallel parity at all. Exit 1; pass "
                 "--allow-no-parallel if that is what you meant.")
        return RunSummary(results, header, 1 if failed or unchecked else 0)

    def hand_over(self, error: Exception) -> handover.RunStopped:
        """The run's own process failed: write the finished cases' reports, marked incomplete, keep the traceback
        and the partial file (so `--resume` goes on), say so in one line."""
        cause, report_dir = handover.describe(error), self.report_dir
        kept_at = handover.keep_traceback(error, launches_folder(report_dir))
        results = self.results(cause)
        wrote = f"reports of the finished cases in {report_dir}, marked incomplete"
        try:
            header = self.header(results, GroupStats(), 0.0)
            header.incomplete = f"the harness stopped at an internal error: {cause}"
            write_reports(report_dir, results, header)
        except Exception as failure:  # noqa: BLE001 - the reports' own bug: say so, keep what can be kept
            wrote = f"the reports could not be written either ({handover.describe(failure)})"
        left = {p.case.case_id for p in self.plan if p.runs and p.case.case_id not in self.done}
        line = handover.stopped_line(cause, kept_at, len(self.done), len(left), report_dir / PARTIAL, wrote)
        self.echo(line)
        return handover.RunStopped(line, results, left)


def _with_rank_death(result: CaseResult, death: dict | None) -> CaseResult:
    """The earlier attempt a rank's native death ended, kept whatever the rerun's verdict (harness.run.launch); a
    PASS says it in its reason, so every view that lists a passing case's note shows it."""
    result.rank_death = death
    if death and result.status is Status.PASS and not result.reason:
        result.reason = f"PASS on its rerun in a fresh group; in its first attempt {death['error']}"
    return result


def _rank_deaths_line(results: list[CaseResult]) -> str:
    """'rank deaths: 1 (a native signal; each case ran once more in a fresh group): <case> PASS on its rerun'."""
    died = [result for result in results if result.rank_death]
    return textwrap.fill(f"rank deaths: {len(died)} (a native signal; each case ran once more in a fresh group): "
                         + ", ".join(f"{result.case_id} {result.status.value} on its rerun" for result in died),
                         matrix.WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def _tidy_work(workdir: Path, settings: Settings, failed: bool, echo, died: bool = False) -> None:
    """The work folder (launch logs, rank events, the shared baselines) is only needed while the run lasts: removed
    after a run where every case ended well, kept (and said where) when a case failed or a rank died (`died`, its
    launch's log beside its stack), with --keep-work, or over several nodes (whose agents read it until they
    leave)."""
    if failed or died or settings.keep_work or settings.nnodes > 1:
        why = "a case failed" if failed else "a rank died" if died else "--keep-work" if settings.keep_work else \
            "several nodes read it"
        echo(f"work files kept in {workdir} ({why}): each launch's log and rank events")
        return
    shutil.rmtree(workdir, ignore_errors=True)


def _no_parallel_ran(plan: list[PlannedCase], results: list[CaseResult]) -> bool:
    """The plan asked for parallel layouts and none of its cases with more than one rank ran."""
    asked = any(p.case.world_size > 1 for p in plan)
    ran = any(r.world_size > 1 and r.status.ran for r in results)
    return asked and not ran


def _to_localize(result: CaseResult, every: bool, failures: bool = True) -> bool:
    """Every FAIL (unless `failures` is off); with --localize every case that produced numbers (a known issue that
    failed numerically too)."""
    if not kind_of(result.kind).localizes:
        return False
    if result.status is Status.FAIL and _of_one_device(result):
        return False
    if result.status is Status.FAIL:
        return failures or every
    numbers = result.status in (Status.PASS, Status.XPASS) or (
        result.status is Status.XFAIL and str(result.extra.get("observed", "")).startswith("FAIL"))
    return every and numbers


def _of_one_device(result: CaseResult) -> bool:
    """Every check the case failed is measured on one device alone (`Check.one_device`): the ranks' modules cannot
    show where it went wrong."""
    checks = known_checks()
    return bool(result.evidence) and all(
        item["check"] in checks and checks[item["check"]].one_device for item in result.evidence)


def _localize_all(cases, settings: Settings, report_dir: Path, done: dict, echo,
                  measure: coverage_run.Measure | None = None) -> None:
    """Rerun the cases to find where each breaks (one launch per world size); the status stays what it was."""
    if not cases:
        return
    echo(f"localizing {len(cases)} case(s): where each first leaves the single-device run")
    checkpoints = launches_folder(report_dir) / FOLDER  # the run's own, kept for this (a failed case keeps them)
    group = _measured(GroupSpec("", str(settings.path("references")), None, [],
                                compile_cache=compile_cache(settings, report_dir),
                                checkpoints=str(checkpoints) if checkpoints.is_dir() else None), measure)

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
            result.first_divergence = first_divergence(result, found)
        echo(f"  {result.case_id}: {result.first_divergence}")

    for members in group_by_world_size(replace(case, localize=True) for case in cases).values():
        timeout = settings.case_timeout or _auto_timeout(members, settings.path("references"))
        run_group(members, group, launches_folder(report_dir) / "localize", timeout, on_outcome,
                  Nodes(forked=forked(settings)))


def forked(settings: Settings) -> bool:
    """Whether this run's launches fork their ranks from the warm parent (harness.run.warm)."""
    return warm.serves(settings)


def compile_cache(settings: Settings, report_dir: Path) -> str:
    """Inductor's cache folder for the ranks: `--compile-cache`, else the report folder's own, in its work folder
    (harness.run.folders: never in the artifact). Not the machine's shared /tmp/torchinductor_$USER: two runs
    compiling one graph into one cache at once wait on each other's locks, and one can load a kernel's library while
    the other is still writing it ("file too short"); a report folder has one live run (harness.run.lock), so its
    cache has one writer, and stays warm for the next run into it."""
    return str(settings.path("compile_cache") if settings.compile_cache else compile_cache_folder(report_dir))


def _launch_all(cases, settings: Settings, report_dir: Path, issues, refusals: dict, done: dict,
                echo, measure: coverage_run.Measure | None = None) -> GroupStats:
    workdir = launches_folder(report_dir)
    shutil.rmtree(workdir, ignore_errors=True)
    total, stats = len(done) + len(cases), GroupStats()  # cases kept by --resume count as done
    checkpoints = write_checkpoints(cases, settings.path("references"), workdir, echo)
    group = GroupSpec("", str(settings.path("references")), str(report_dir / "images"), [],
                      baselines=str(workdir / "baselines"),
                      compile_cache=compile_cache(settings, report_dir),
                      checkpoints=str(checkpoints) if checkpoints else None)
    group = _measured(group, measure)
    launcher = launcher_from(settings)
    with open(report_dir / PARTIAL, "a") as partial, _shared(launcher.nnodes, workdir) as shared:
        nodes = Nodes(launcher, _capacity(settings), shared, forked(settings))

        def on_outcome(outcome: Outcome) -> None:
            result = judge(outcome, settings)
            result = apply_known_issues(apply_expected_refusal(result, refusals.get(result.case_id)), issues)
            result = note_repro(result, outcome.case)
            result = _with_rank_death(result, outcome.record.rank_death)
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


def _measured(group: GroupSpec, measure: coverage_run.Measure | None) -> GroupSpec:
    """The group's ranks measure coverage into the run's folder (`--coverage`), or nothing."""
    if measure is None:
        return group
    return replace(group, coverage_dir=str(measure.folder), coverage_files=measure.files)


def _shared(nnodes: int, workdir: Path):
    """Node 0's side of a run over several nodes (the others follow it through `workdir`); nothing on one host."""
    import contextlib

    return SharedRun(workdir, nnodes) if nnodes > 1 else contextlib.nullcontext()


def _auto_timeout(cases, root: Path) -> float:
    """The default case timeout for the largest reference's weights among `cases`."""
    paths = [reference_path(root, c.model, c.shape, kind_of(c.kind).reference_kind) for c in cases]
    sizes = [path.stat().st_size for path in paths if path.exists()]
    return auto_case_timeout(max(sizes, default=0))


def _progress_line(index: int, result: CaseResult, total: int) -> str:
    number = f" {result.cell}" if result.cell else ""
    seconds = f" {result.seconds:.2f}s" if result.seconds is not None else ""
    line = f"[{index}/{total}] {result.status.value:7s} {result.case_id}{number}{seconds}"
    if result.reason and result.status is not Status.PASS:
        line += "  (" + " ".join(result.reason.split()) + ")"
    return _shorten(line)


def _shorten(text: str, limit: int = matrix.WIDTH) -> str:
    """`text` within the terminal width every line a run prints fits in, its closing parenthesis kept."""
    if len(text) <= limit:
        return text
    closing = ")" if text.endswith(")") else ""
    return text[: limit - 3 - len(closing)] + "..." + closing


def _clear_previous(report_dir: Path, echo) -> None:
    """A new run replaces the reports of the last one in this folder, PNGs included (none may outlive its case)."""
    if (report_dir / RESULTS_FILE).exists():
        echo(f"note: replacing the previous run's reports in {report_dir} (--report-dir DIR keeps them)")
    shutil.rmtree(report_dir / "images", ignore_errors=True)


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
