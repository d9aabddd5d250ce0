"""Shared fixtures for the harness's own tests."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

# Each test file's wall seconds in the last measured run of the test command (benchmarks/bench_tests.py
# --write-durations): the order pytest-xdist hands the files out in.
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: files in the order below, not by their size
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, whose workers each take a whole file (harness.plugin), the longest files first and the
    quickest last, so the workers end together: ordered by their number of tests, the few-test files that launch
    ranks came last, and one worker ran the last of them while the other waited. A file not measured yet goes
    first. Only the order changes: every item runs. Sorted where it counts, on the workers: the scheduler hands the
    files out in the order a worker collected them, and a worker's own `dist` option is "no"."""
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker
        return
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    # a stable sort: a file's items stay together and in their order, files of equal seconds in theirs
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], float("inf")))


def rewrite_reference_meta(path, change) -> None:
    """Edit the harness metadata inside a reference's safetensors header in place (the checksum covers tensors only),
    to fake a reference from another version or schema."""
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    meta = json.loads(header["__metadata__"]["harness"])
    change(meta)
    header["__metadata__"]["harness"] = json.dumps(meta)
    encoded = json.dumps(header).encode()
    encoded += b" " * ((8 - len(encoded) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + size:])


@pytest.fixture(scope="session", autouse=True)
def one_warm_parent_for_the_commands_tests_start(request, tmp_path_factory):
    """The `harness` commands and pytest sessions the slow tests start fork their ranks from one warm parent of this
    session's worker instead of each importing torch and diffusers for its own, and the commands themselves run in
    a fork of a second one, started for this session's environment (harness.run.warm.share, run_in_shared)."""
    if not any(item.get_closest_marker("slow") for item in request.session.items):
        yield None
        return
    import torch

    from harness.run import warm
    from harness.run.launchers import node_env

    if torch.cuda.is_available():  # CUDA ranks start under torchrun
        yield None
        return
    parent = warm.share(tmp_path_factory.mktemp("warm"), node_env(0))
    commands = warm.share(tmp_path_factory.mktemp("commands"), dict(os.environ))
    yield parent
    commands.close()
    parent.close()


@pytest.fixture
def rewrite_meta():
    return rewrite_reference_meta


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with its own pyproject.toml, so tests never touch the real references/ or reports/."""
    # eager only: a test of the compile axis asks for its modes (the quick plan's compile slice costs minutes); the
    # enable load only and no flow: a test of the load or flow axis asks for them (the quick plan's load and flow
    # slices add cases)
    (tmp_path / "pyproject.toml").write_text('[tool.harness]\nmodes = ["eager"]\nloads = ["enable"]\n'
                                            'flows = ["none"]\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def zoo_references(tmp_path_factory):
    """fp32 references of the tiny zoo captured once per session into a scratch folder (milliseconds per model)."""
    from harness.catalogue.zoo import SPECS
    from harness.run.capture import capture_all

    root = tmp_path_factory.mktemp("references")
    capture_all(list(SPECS), root, kinds=["tensor"], shapes=["default"], echo=lambda _: None)
    return root


@pytest.fixture
def settings_for(project, zoo_references):
    """Settings of a scratch project that uses the session's references; keyword arguments override options."""
    from harness.run.settings import load_settings

    def make(**overrides):
        overrides = {"references": str(zoo_references), "known_issues": str(project / "known.toml"), **overrides}
        return load_settings(overrides, start=project)

    return make

