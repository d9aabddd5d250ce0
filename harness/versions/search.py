"""What each step of a bisection shares, over releases (harness.versions.bisect) or over git
(harness.versions.bisect_git): a revision's run of the cases, the search's settings, both ends, and the report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.core import axes
from harness.core.errors import HarnessError
from harness.core.results import CaseResult, Status
from harness.run import reference_drift
from harness.versions.cases import as_flags, plan_options
from harness.versions.envs import env_for
from harness.versions.revisions import Revision
from harness.versions.sides import results, run_harness, status_line

Echo = Callable[[str], None]


@dataclass
class Step:
    """One revision's run of the cases: {case_id: its result}."""

    label: str
    cases: dict[str, CaseResult]
    python: str | None = None  # the interpreter of its environment (runs a repro script with its diffusers)

    def statuses(self) -> dict[str, str]:
        return {case_id: case.status.value for case_id, case in self.cases.items()}

    def to_dict(self) -> dict:
        """As a line of `git bisect run`'s steps file (harness.versions.bisect_git)."""
        return {"label": self.label, "cases": {case_id: case.to_dict() for case_id, case in self.cases.items()},
                "python": self.python}

    @classmethod
    def from_dict(cls, data: dict) -> Step:
        return cls(data["label"], {case_id: CaseResult.from_dict(case) for case_id, case in data["cases"].items()},
                   data.get("python"))

    def lines(self) -> list[str]:
        return [f"{case_id} {status_line(case)}" for case_id, case in self.cases.items()]

    def cannot_run(self) -> str | None:
        """Why this revision cannot test the cases, or None: one did not run (SKIP or N/A, e.g. an older release
        without the API a flow needs or the config a layout needs), so its status says nothing of the change."""
        idle = [f"{case_id} {status_line(case)}" for case_id, case in self.cases.items() if not case.status.ran]
        return "; ".join(idle) or None


@dataclass
class Search:
    """What every step needs: the cases, the flags of their runs, where reports and environments go, and the
    statuses that make a revision good."""

    case_ids: list[str]
    flags: list[str]
    report_dir: Path
    cache: Path
    good: dict | None = None  # {case_id: status} at --good (None while the oldest release that runs them is sought)
    overrides: dict | None = None  # the options given (for the plan a repro script is checked against)

    def evaluate(self, revision: Revision, echo: Echo) -> Step:
        env = env_for(revision, self.cache, echo)
        folder = self.report_dir / revision.slug
        run_harness(env, ["run", *self.flags, *as_flags(plan_options(self.case_ids)), f"--report-dir={folder}"],
                    folder / "run.log")
        rows = {case.case_id: case for case in results(folder)[1]}
        missing = [case_id for case_id in self.case_ids if case_id not in rows]
        if missing:
            raise HarnessError(f"{revision.label}: its run has no case {', '.join(missing)} (log: "
                               f"{folder / 'run.log'})")
        return Step(revision.label, {case_id: rows[case_id] for case_id in self.case_ids}, str(env.python))

    def is_good(self, step: Step) -> bool:
        return step.statuses() == self.good

    def say(self, step: Step, echo: Echo) -> None:
        verdict = "cannot run it, neither good nor bad" if step.cannot_run() else \
            "runs it" if self.good is None else "good" if self.is_good(step) else "bad"
        for line in step.lines():
            echo(f"bisect: {step.label}: {line} -> {verdict}")


def ends(good: Revision, bad: Revision, search: Search, echo: Echo) -> tuple[Step, Step]:
    """Both ends, --good first (it captures any missing reference); the same statuses at both is an error where
    both ran the cases (an end that could not is for the caller: over releases, the older end may be one)."""
    first = search.evaluate(good, echo)
    search.good = first.statuses()
    search.say(first, echo)
    last = search.evaluate(bad, echo)
    search.say(last, echo)
    if last.statuses() == first.statuses() and not (first.cannot_run() or last.cannot_run()):
        said = "; ".join(f"{case_id} {status}" for case_id, status in first.statuses().items())
        raise HarnessError(f"the case never changes between {good.label} and {bad.label} ({said} at both ends): "
                           "nothing to bisect")
    return first, last


def must_run(step: Step) -> None:
    """An end the search compares against has to run the cases: else one clear line saying why it did not."""
    if step.cannot_run():
        raise HarnessError(f"{step.label} cannot run the case(s), so it is neither good nor bad: "
                           f"{step.cannot_run()}; give an end that runs them")


def finish(before: Step, after: Step, skipped: list[str], search: Search, echo: Echo) -> int:
    """The first revision that changed, the figures either side, and a repro script for the failing side."""
    changes = ", ".join(f"{case_id} {before.statuses()[case_id]} -> {after.statuses()[case_id]}"
                        for case_id in search.case_ids)
    where = f"between {before.label} and {after.label} (untestable: {', '.join(skipped)})" if skipped else \
        after.label
    return _report([f"bisect: first revision that changed ({changes}): {where}",
                    *(f"  {before.label}: {line}" for line in before.lines()),
                    *(f"  {after.label}: {line}" for line in after.lines()),
                    *_moved(before), *_moved(after)], (before, after), search, echo)


def _moved(step: Step) -> list[str]:
    """Where each case's one device left the references every step compares with (harness.engine.drift): between
    the two revisions either side, the first module that moved."""
    return [f"  {step.label}: {case_id}: {text}" for case_id, case in step.cases.items()
            if (text := reference_drift.said(case))]


def present_since(oldest: Step, unrunnable: list[Step], search: Search, echo: Echo) -> int:
    """No revision that runs the cases changed them: the oldest that runs them already has the newer end's
    statuses; the older ones could not run them (each with why), so they count as neither good nor bad."""
    statuses = ", ".join(f"{case_id} {status}" for case_id, status in oldest.statuses().items())
    return _report([f"bisect: every revision that can run the case(s) has the same statuses ({statuses}), from "
                    f"{oldest.label}, the oldest that runs them",
                    *(f"  {oldest.label}: {line}" for line in oldest.lines()),
                    *(f"  {step.label}: cannot run it: {step.cannot_run()}" for step in unrunnable)],
                   (oldest,), search, echo)


def _report(lines: list[str], steps: tuple[Step, ...], search: Search, echo: Echo) -> int:
    """Say the end of the search, keep it in bisect.md, and write a repro script for each FAIL it shows."""
    for line in lines:
        echo(line)
    search.report_dir.mkdir(parents=True, exist_ok=True)
    (search.report_dir / "bisect.md").write_text("\n".join(["```", *lines, "```", ""]), encoding="utf-8")
    for step in steps:
        for case_id in [case_id for case_id, case in step.cases.items() if case.status is Status.FAIL]:
            echo(f"repro ({step.label}) {case_id}: {_repro(case_id, step, search)}")
    return 0


def _repro(case_id: str, step: Step, search: Search) -> str:
    """The command that runs the case's standalone script with that revision's diffusers (or why there is none)."""
    from harness.versions.repro import run_command, write_repro

    try:
        out, _ = write_repro(case_id, search.report_dir / "repro" / f"{axes.file_stem(case_id)}.py", search.overrides)
    except HarnessError as error:
        return f"not scripted: {error}"
    return run_command(out, step.cases[case_id].world_size, step.python)
