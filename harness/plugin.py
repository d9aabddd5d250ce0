"""pytest plugin: `pytest --ref` captures references, plain `pytest` runs the parity matrix as test items.

Hooks and options only; torch and diffusers are imported lazily so `pytest --help` stays fast.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    from harness.run.settings import OPTIONS, RUN_OPTIONS

    group = parser.getgroup("harness", "diffusers parity harness")
    group.addoption("--ref", action="store_true", help="Capture missing fp32 references instead of comparing.")
    group.addoption("--ref-force", action="store_true", help="With --ref: replace existing references too.")
    for name in RUN_OPTIONS:
        group.addoption(f"--harness-{name.replace('_', '-')}", dest=f"harness_{name}", default=None,
                        help=f"{OPTIONS[name].help} Same as {OPTIONS[name].where()}.")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", "parity: a case of the parity matrix (one harness case per item)")
    # All parity items share one matrix run, so they must stay on one xdist worker: the matrix is then run, and its
    # files written, once. `loadfile` does that (the items live in one file); `xdist_group` no longer groups under
    # pytest 9.2 (pytest-xdist#1386). tryfirst: decided before xdist reads the option to build its scheduler.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadfile"


def settings_from(config):
    """The run's settings for this session. The parity items write to `<report_dir>.work/pytest` unless
    `--harness-report-dir` says where: a `harness run` in the same checkout, started beside `pytest`, then never
    meets them (each folder holds one live run), and the folder a CI job uploads holds no test scratch."""
    from dataclasses import replace

    from harness.run.folders import pytest_report_folder
    from harness.run.settings import RUN_OPTIONS, load_settings

    overrides = {name: config.getoption(f"harness_{name}") for name in RUN_OPTIONS}
    settings = load_settings(overrides, start=config.rootpath)
    if settings.shard or settings.launcher != "local":  # one process judges, and pytest's items are the whole plan
        raise pytest.UsageError("--harness-shard and --harness-launcher are for `harness run` (then `harness merge`); "
                                "under pytest select items with -k")
    if overrides["report_dir"] is None:
        settings = replace(settings, report_dir=str(pytest_report_folder(settings.path("report_dir"))))
    return settings


def pytest_generate_tests(metafunc):
    if "parity_case" in metafunc.fixturenames:
        plan = [] if metafunc.config.getoption("ref") else _plan(metafunc.config)
        metafunc.parametrize("parity_case", plan, ids=[p.case.case_id for p in plan])
    if "reference_target" in metafunc.fixturenames:
        targets = []
        if metafunc.config.getoption("ref"):
            from harness.run.capture import reference_targets

            settings = settings_from(metafunc.config)
            targets = reference_targets(settings.models, settings.kinds, weights_dir=settings.weights,
                                        scopes=settings.scopes)
        metafunc.parametrize("reference_target", targets,
                             ids=[f"{model}@{shape}/{kind}" for kind, model, shape, _ in targets])


def _plan(config):
    """The parity items' plan. The warm parent the launches fork from starts first, so its imports overlap those of
    planning, as `harness run` does; not on an xdist worker, which collects every file but may not run these."""
    from harness.run import warm

    settings = settings_from(config)
    if not hasattr(config, "workerinput"):
        warm.start_early(settings)
    from harness.run.runner import plan_from

    return plan_from(settings)


def pytest_collection_modifyitems(config, items):
    """Parity items get their marker. Reference items exist only under `--ref`, parity items only without it (the
    other would be one empty-parameter SKIP on every run), so each is deselected where it has no cases."""
    capturing = config.getoption("ref")
    kept, dropped = [], []
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "parity_case" in names:
            item.add_marker(pytest.mark.parity)
        idle = ("reference_target" in names and not capturing) or ("parity_case" in names and capturing)
        (dropped if idle else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


SELECTED = pytest.StashKey[list]()


def pytest_collection_finish(session):
    session.config.stash[SELECTED] = [
        item.callspec.params["parity_case"] for item in session.items
        if hasattr(item, "callspec") and "parity_case" in item.callspec.params
    ]


@pytest.fixture(scope="session")
def parity_results(request):
    """Runs every selected parity case once, in as few torchrun launches as the plan allows."""
    from harness.core.errors import HarnessError
    from harness.run import runner
    from harness.run.handover import RunStopped

    config = request.config
    capture = config.pluginmanager.getplugin("capturemanager")
    try:
        settings = settings_from(config)
        with capture.global_and_fixture_disabled():
            summary = runner.run(settings, config.stash.get(SELECTED, []), capture_missing=False,
                                 echo=lambda line: print(line, flush=True), command=["pytest", *config.args])
    except RunStopped as stopped:  # the finished cases keep their verdicts; the others share one failure
        return ParityResults({result.case_id: result for result in stopped.finished}, stopped=str(stopped),
                             report_dir=settings.path("report_dir"))
    except HarnessError as error:
        return ParityResults(stopped=str(error))
    return ParityResults({result.case_id: result for result in summary.results}, xfail_strict=settings.xfail_strict,
                         report_dir=settings.path("report_dir"))


class ParityResults(dict):
    """The shared run's results by case id; whether an XPASS fails its item (`xfail_strict`); and, when the run could
    not run or finish a case (`stopped`: why), which item said so, so the cause is one failure, not one per item."""

    def __init__(self, results=(), xfail_strict: bool = False, stopped: str = "", report_dir=None):
        super().__init__(results)
        self.xfail_strict, self.stopped, self.report_dir = xfail_strict, stopped, report_dir
        self.said_by: str | None = None

    def stop_for(self, case_id: str) -> None:
        """The first item the run did not reach fails with the cause; every later one skips, naming that item."""
        if self.said_by is None:
            self.said_by = case_id
            pytest.fail(self.stopped or f"{case_id}: the parity run has no result for this case", pytrace=False)
        pytest.skip(f"not run: the parity run stopped before this case (the cause is test_parity[{self.said_by}]'s "
                    "failure)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A parity item whose known issue no longer reproduces passes as pytest's own XPASS (unless strict)."""
    outcome = yield
    report = outcome.get_result()
    results = getattr(item, "funcargs", {}).get("parity_results")
    planned = getattr(item, "funcargs", {}).get("parity_case")
    if report.when != "call" or not report.passed or not isinstance(results, dict) or planned is None:
        return
    result = results.get(planned.case.case_id)
    if result is not None and result.status.value == "XPASS":
        report.wasxfail = result.reason


CAPTURED = pytest.StashKey[dict]()


@pytest.fixture
def captured_reference(request, reference_target):
    """Captures one reference (kept if present, unless --ref-force; kept too when a forced recapture reproduces it);
    returns (path, written). What each item did is summed up at the end of the session."""
    from harness.run.capture import capture_one

    kind, model, shape, weights_dir = reference_target
    settings = settings_from(request.config)
    root, force = settings.path("references"), request.config.getoption("ref_force")
    path, written = capture_one(kind, model, shape, root, force, weights_dir, settings)
    how = "captured" if written else ("kept: the recapture reproduces it" if force else "kept: present")
    request.config.stash.setdefault(CAPTURED, {})[str(path)] = how
    return path, written


def pytest_terminal_summary(terminalreporter, config):
    """`pytest --ref`: each reference, and whether it was captured or kept (and why)."""
    done = config.stash.get(CAPTURED, {})
    if not done:
        return
    terminalreporter.section("references")
    for how in sorted(set(done.values())):
        paths = sorted(path for path, said in done.items() if said == how)
        terminalreporter.write_line(f"{how} ({len(paths)}): {', '.join(paths)}")


def check_reference(captured) -> None:
    """`pytest --ref`: the reference just captured (or kept) reads back whole, with a finite output."""
    from harness.core.reference import read_reference

    path, _written = captured
    assert read_reference(path).output.isfinite().all(), f"{path}: the captured fp32 output is not finite"


def check_parity(planned, results) -> None:
    """The pytest outcome of one parity case: SKIP and XFAIL as pytest's own (REFUSED as an xfail), FAIL/ERROR/TIMEOUT
    as a failure that says what broke and how to rerun the case alone, PASS as a pass. pytest has no outcome for a
    combination that cannot exist: N/A is a skip whose reason starts with "not applicable: " (`NOT_APPLICABLE`)."""
    from harness.core.applicability import status_of
    from harness.core.results import Status

    if planned.skip_reason:
        pytest.skip(_skip_text(status_of(planned.skip_reason), planned.skip_reason))
    result = results.get(planned.case.case_id)
    if result is None:
        results.stop_for(planned.case.case_id)
    if not result.status.ran:
        pytest.skip(_skip_text(result.status, result.reason))
    if result.status in (Status.XFAIL, Status.REFUSED):  # a refusal: pytest's xfail(raises=...), the nearest outcome
        pytest.xfail(result.reason)
    if result.status is Status.XPASS:
        if results.xfail_strict:
            pytest.fail(f"{result.case_id}: XPASS(strict): {result.reason}", pytrace=False)
        return  # reported as XPASS by pytest_runtest_makereport
    if result.status.is_bad:
        pytest.fail(f"{result.case_id}: {result.status.value}{_numbers(result)}: {result.reason}\n"
                    f"details: {results.report_dir / 'results.json'}; rerun alone: {rerun_command(result)}"
                    + (f"; a standalone script: {result.extra['repro']}" if result.extra.get("repro") else ""),
                    pytrace=False)
    assert result.status is Status.PASS


NOT_APPLICABLE = "not applicable: "  # how a pytest skip says N/A


def _skip_text(status, reason: str) -> str:
    """A skip's reason, marked when the case is N/A rather than SKIP."""
    from harness.core.results import Status

    return f"{NOT_APPLICABLE}{reason}" if status is Status.NOT_APPLICABLE else str(reason)


def _numbers(result) -> str:
    """The figures of the case that answer to a limit (whatever its kind measures), with their limits."""
    from harness.core.figures import written

    shown = " ".join(f"{figure['name']}={written(figure)} (limit {figure['limit']:.3g})" for figure in result.figures
                     if figure.get("limit") is not None and figure.get("value") is not None)
    return f" {shown}" if shown else ""


def rerun_command(result) -> str:
    """The `harness run` that runs exactly this case's model, shape, layout, backend, dtype, kind, load and mode."""
    from harness.core.modes import EAGER
    from harness.loads import ENABLE

    return (f"harness run --models {result.model} --shapes {result.shape} --layouts {result.layout} "
            f"--backends {result.backend} --dtypes {result.dtype} --kinds {result.kind}"
            + ("" if result.load == ENABLE else f" --loads {result.load} --load-cases '*'")
            + ("" if result.mode == EAGER else f" --modes {result.mode}"))
