"""pytest plugin of benchmarks/bench_tests.py (`-p timed_items`): while each test item runs, `HARNESS_TIME_LOG`
names a file of that item's own, so every harness run the item makes (in this process, a `harness run` it starts,
or a pytest it nests, which inherit the variable) appends its time breakdown there."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from harness.run.timing import TIME_LOG

FOLDER = "HARNESS_TIME_LOGS"  # the folder of the per-item files, set by bench_tests.py


def log_file(folder: Path | str, nodeid: str) -> Path:
    """The file an item's runs append to, named from its node id (ids hold characters no file name may)."""
    return Path(folder) / f"{hashlib.sha1(nodeid.encode()).hexdigest()[:20]}.jsonl"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    os.environ[TIME_LOG] = str(log_file(os.environ[FOLDER], item.nodeid))
    try:
        yield
    finally:
        os.environ.pop(TIME_LOG, None)
