"""When the run's own process fails (a bug of the harness, not of a case), it hands over what it has instead of dying
with a traceback: the ranks are stopped (the launcher's `finally`), the finished cases' reports are written and
marked incomplete, the traceback is kept in the work folder, and one line says what broke and how to go on.

Exit codes of `harness run`: 0 every case ended well; 1 a case failed (or no parallel case ran); 2 a user error
(bad option or input, the folder in use); 3 this: the harness stopped at an internal error, reports incomplete,
`--resume` goes on; 130 (128 + signal) interrupted.
"""

from __future__ import annotations

import shlex
import traceback
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.results import CaseResult, Status

TRACEBACK_FILE = "internal-error.txt"  # in the work folder, which a stopped run keeps


class RunStopped(HarnessError):
    """The harness stopped at an internal error after writing the finished cases' reports."""

    exit_code = 3

    def __init__(self, message: str, results: list[CaseResult], unfinished: set[str]):
        super().__init__(message)
        self.results, self.unfinished = results, unfinished  # every planned case; the ids it did not finish

    @property
    def finished(self) -> list[CaseResult]:
        return [result for result in self.results if result.case_id not in self.unfinished]


def describe(error: BaseException) -> str:
    """`RuntimeError: what it said`, on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def keep_traceback(error: BaseException, workdir: Path) -> Path | None:
    """The whole traceback, written where the run's other work files are; None when even that cannot be written."""
    path = Path(workdir) / TRACEBACK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(error)))
    except OSError:
        return None
    return path


def unfinished(result: CaseResult, cause: str) -> CaseResult:
    """A case the stopped run did not finish: ERROR that says why and that `--resume` runs it."""
    result.status = Status.ERROR
    result.reason = f"not run: the harness stopped at an internal error before this case ({cause}); " \
                    "`harness run --resume` runs it"
    return result


def stopped_line(cause: str, kept_at: Path | None, finished: int, left: int, partial: Path, wrote: str) -> str:
    """The one line a stopped run ends with, and the command that goes on (in the same folder, whoever started it:
    the parity items under pytest write elsewhere than `harness run`)."""
    where = f" (traceback: {kept_at})" if kept_at else ""
    folder = shlex.quote(_shown(partial.parent))
    return (f"harness: internal error: {cause}{where}; {wrote}; {finished} finished case(s) kept in {partial}: "
            f"`harness run --resume --report-dir {folder}` runs the other {left}")


def _shown(path: Path) -> str:
    """`path` relative to here when it is below here, as a person would type it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
