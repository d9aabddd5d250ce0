"""Where a run's files go. The report folder (`--report-dir`, `reports/`) holds only what a reviewer reads: the page,
results.json, the matrices, the images and compare pages it links; a CI job uploads it as it is. Everything else a
run needs (its lock, Inductor's cache, the launches' work files and checkpoints, the parity items' own report under
pytest) lives beside it, in `<report_dir>.work/` (`reports.work/`): caches of tens of MB never reach the artifact,
and each report folder still has its own cache, written only by the one live run that holds the folder's lock.
"""

from __future__ import annotations

from pathlib import Path

WORK_SUFFIX = ".work"
# each launch's log (torchrun.log, or ranks.log for forked ranks) and rank events, the baselines, checkpoints, coverage
LAUNCHES = "launches"
COMPILE_CACHE = "compile-cache"  # the report folder's own Inductor cache (`--compile-cache` unset)
PYTEST_REPORTS = "pytest"  # the parity items' report folder under pytest, unless `--harness-report-dir` says where


def work_folder(report_dir: Path | str) -> Path:
    """`<report_dir>.work`, beside the report folder (`.` or `..` are named by where they resolve to)."""
    folder = Path(report_dir)
    if folder.name in ("", ".."):
        folder = folder.resolve()
    return folder.with_name(folder.name + WORK_SUFFIX)


def launches_folder(report_dir: Path | str) -> Path:
    """The run's work files: emptied when a run starts, removed when every case ended well (`--keep-work`)."""
    return work_folder(report_dir) / LAUNCHES


def compile_cache_folder(report_dir: Path | str) -> Path:
    return work_folder(report_dir) / COMPILE_CACHE


def pytest_report_folder(report_dir: Path | str) -> Path:
    return work_folder(report_dir) / PYTEST_REPORTS
