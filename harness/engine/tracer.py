"""coverage.py in a rank (`harness run --coverage`): which statements of diffusers' parallel code this process ran.

Started once per rank process, before anything imports diffusers, measuring only the files the run names (coverage
then traces no other file's lines); stopped once, when the rank ends. The data are saved to a file of this process
(coverage's data suffix: host, pid, random) in the run's coverage folder, which the run combines once
(harness.run.coverage). The launcher ends the ranks as soon as rank 0 has reported a launch's last case, so each rank
saves after its launch's last case, before that case's gathers (no rank passes them before all have saved); and a
rank killed after a hang loses only what it ran since its last save: the data are also saved after a case when
SAVE_S have passed since the last save (a few milliseconds each), never per case.
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.core.records import GroupSpec

SAVE_S = 30.0
# coverage.py's own warnings would land in every rank's log: the run reports what was and was not measured.
QUIET = ["no-data-collected", "module-not-imported", "module-not-measured", "include-ignored", "no-ctracer"]


class Tracer:
    def __init__(self, folder: Path, files: list[str]):
        import coverage

        folder.mkdir(parents=True, exist_ok=True)
        self.coverage = coverage.Coverage(data_file=str(folder / "rank"), data_suffix=True, include=files,
                                          branch=False, config_file=False, auto_data=False)
        self.coverage.set_option("run:disable_warnings", QUIET)
        self.coverage.start()
        self.saved = time.monotonic()

    def after_case(self, last: bool = False) -> None:
        if last or time.monotonic() - self.saved >= SAVE_S:
            self.save()

    def save(self) -> None:
        self.coverage.save()
        self.saved = time.monotonic()

    def stop(self) -> None:
        self.coverage.stop()
        self.coverage.save()


def start(group: GroupSpec) -> Tracer | None:
    """The rank's tracer when the run measures coverage (None otherwise)."""
    if not group.coverage_dir:
        return None
    return Tracer(Path(group.coverage_dir), list(group.coverage_files))
