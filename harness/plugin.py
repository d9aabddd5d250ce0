"""pytest plugin: `pytest --ref` captures references, plain `pytest` runs the parity matrix as test items.

Hooks and options only; torch and diffusers are imported lazily so `pytest --help` stays fast.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    from harness.settings import OPTIONS, RUN_OPTIONS

    group = parser.getgroup("harness", "diffusers parity harness")
    group.addoption("--ref", action="store_true", help="Capture missing fp32 references instead of comparing.")
    group.addoption("--ref-force", action="store_true", help="With --ref: replace existing references too.")
    for name in RUN_OPTIONS:
        group.addoption(f"--harness-{name.replace('_', '-')}", dest=f"harness_{name}", default=None,
                        help=f"{OPTIONS[name].help} Same as [tool.harness] {name}.")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", "parity: a case of the parity matrix (one harness case per item)")
    # All parity items share one matrix run, so they must stay on one xdist worker: the matrix is then run, and its
    # files written, once. `loadfile` does that (the items live in one file); `xdist_group` no longer groups under
    # pytest 9.2 (pytest-xdist#1386). tryfirst: decided before xdist reads the option to build its scheduler.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadfile"


def settings_from(config):
    from harness.settings import RUN_OPTIONS, load_settings

    overrides = {name: config.getoption(f"harness_{name}") for name in RUN_OPTIONS}
    return load_settings(overrides, start=config.rootpath)


def pytest_generate_tests(metafunc):
    if "parity_case" in metafunc.fixturenames:
        from harness.runner import plan_from

        plan = [] if metafunc.config.getoption("ref") else plan_from(settings_from(metafunc.config))
        metafunc.parametrize("parity_case", plan, ids=[p.case.case_id for p in plan])
    if "reference_target" in metafunc.fixturenames:
        targets = _reference_targets(metafunc.config) if metafunc.config.getoption("ref") else []
        metafunc.parametrize("reference_target", targets, ids=[f"{m}@{shape}/{kind}" for m, shape, kind in targets])


def _reference_targets(config) -> list[tuple[str, str, str]]:
    """(model, shape, kind) of every reference the configured plan can need."""
    from harness.image_runs import has_pipeline
    from harness.zoo import get_spec

    settings, targets = settings_from(config), []
    for name in settings.models:
        if "tensor" in settings.kinds:
            targets += [(name, shape, "tensor") for shape in get_spec(name).shapes]
        if "image" in settings.kinds and has_pipeline(name) and settings.weights is None:
            targets.append((name, "default", "image"))
    return targets


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "parity_case" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.parity)


def pytest_collection_finish(session):
    session.config._harness_selected = [
        item.callspec.params["parity_case"] for item in session.items
        if hasattr(item, "callspec") and "parity_case" in item.callspec.params
    ]


@pytest.fixture(scope="session")
def parity_results(request):
    """Runs every selected parity case once, in as few torchrun launches as the plan allows."""
    from harness import runner
    from harness.errors import HarnessError

    config = request.config
    capture = config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            summary = runner.run(settings_from(config), config._harness_selected, capture_missing=False,
                                 echo=lambda line: print(line, flush=True))
    except HarnessError as error:
        return error
    return {result.case_id: result for result in summary.results}


@pytest.fixture
def captured_reference(request, reference_target):
    """Captures one reference (kept if present, unless --ref-force); returns (path, written)."""
    from harness.capture import capture_one
    from harness.image_runs import capture_image
    from harness.zoo import get_spec

    model, shape, kind = reference_target
    root, force = settings_from(request.config).path("references"), request.config.getoption("ref_force")
    if kind == "image":
        return capture_image(model, root, force)
    return capture_one(get_spec(model), shape, root, force)
