"""Running the harness of a revision's environment: `harness run` as a subprocess of that environment's Python, in
this folder (so the same `[tool.harness]` applies), its output kept in a log, and its results.json read back."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.figures import is_number
from harness.core.header import RunHeader
from harness.core.results import RESULTS_FILE, CaseResult, Status, read_results
from harness.versions.envs import Env, harness_root


def run_harness(env: Env, args: list[str], log: Path, echo: Callable[[str], None] | None = None,
                prefix: str = "") -> int:
    """`harness <args>` in `env`, every line into `log` (and through `echo`, prefixed); its exit code. A user error
    of that run (exit 2) is this command's error too, with that run's own message."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle, subprocess.Popen(env.harness(*args), stdout=subprocess.PIPE, env=this_harness(),
                                                    stderr=subprocess.STDOUT, text=True) as process:
        handle.write(f"$ {' '.join(env.harness(*args))}\n")
        try:
            for line in process.stdout:
                handle.write(line)
                if echo is not None:
                    echo(f"{prefix}{line.rstrip()}")
            code = process.wait()
        except BaseException:  # Ctrl-C or SIGTERM: the side's own handlers stop its ranks; wait for that
            process.terminate()
            process.wait(timeout=60)
            raise
    if code == 2:
        said = [line for line in log.read_text().splitlines() if line.startswith("harness: error:")]
        raise HarnessError(f"{env.revision.label}: " + (said[-1].removeprefix("harness: error: ") if said else
                                                         f"harness {args[0]} exited 2") + f" (log: {log})")
    return code


def this_harness() -> dict[str, str]:
    """The environment of a side's run: this checkout's harness first on its path (and its ranks'). A cached
    environment installs the harness editable from the checkout that built it, which may be another one, older
    than this (without the flows a case names); the harness that runs is the one that was asked."""
    paths = [str(harness_root()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def results(report_dir: Path) -> tuple[RunHeader, list[CaseResult]]:
    """The header and the cases a run wrote, as the records it wrote them from."""
    return read_results(report_dir / RESULTS_FILE, "see the run's log beside it")


def key_figure(case: CaseResult) -> tuple[str, float] | None:
    """The figure its kind calls the case's key one (the matrix cell's; harness.core.figures), when it produced a
    number (None otherwise)."""
    for figure in case.figures:
        if figure.get("cell") and is_number(figure.get("value")):
            return figure["name"], float(figure["value"])
    return None


def status_line(case: CaseResult) -> str:
    """`PASS max_abs_err=2.38e-07`, or the status and the start of its reason."""
    figure = key_figure(case)
    shown = f" {figure[0]}={figure[1]:.3g}" if figure else ""
    reason = " ".join(case.reason.split())
    return f"{case.status}{shown}" + (f" ({reason[:90]})" if reason and case.status is not Status.PASS else "")


def tally(cases: list[CaseResult]) -> str:
    """`11 PASS, 1 FAIL`: the statuses of a set of cases, most common first."""
    return ", ".join(f"{count} {status}" for status, count in Counter(case.status.value for case in cases)
                     .most_common())
