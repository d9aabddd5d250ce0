"""The report of one `harness ab`: the status changes (harness.report.compare: compare.html and its Markdown),
the head's single-device output against the base's reference (did the model itself change?), the parallel parity of
each side (each layout against its own revision's single-device run), a repro script for each FAIL, a one-line
summary, `matrix.md` (for a CI step summary) and `index.html`."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.figures import PARITY, SINGLE_DEVICE, with_role
from harness.core.results import CaseResult, Status
from harness.report.compare import changed_markdown
from harness.report.compare_page import compare_runs
from harness.report.html import render_html
from harness.run import reference_drift
from harness.versions import ab_coverage, ab_known
from harness.versions.sides import key_figure, results, status_line, tally

MOST_REPROS = 20  # scripts written per side; more FAILs are listed by the matrix


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)  # what the terminal shows, the summary first
    exit_code: int = 0


def write(report_dir: Path, envs: dict, captured: list[str], timings: dict, accept_known: bool = False) -> Report:
    read = {side: results(report_dir / side) for side in ("base", "head")}
    cases = {side: read[side][1] for side in read}
    comparison = ab_known.with_known(compare_runs(report_dir / "base", report_dir / "head", out_dir=report_dir),
                                     cases["head"], accept_known)
    render_html(report_dir / "head", base=report_dir / "base")  # the head's page marks what changed per cell
    coverage = ab_coverage.compare(read["base"][0], read["head"][0])
    single = single_device(cases["base"], cases["head"])
    parity = {side: parity_of(cases[side]) for side in cases}
    repros = {side: write_repros(report_dir, side, envs[side], cases[side]) for side in cases}
    labels = {side: envs[side].revision.label for side in envs}
    summary = (f"ab: {labels['base']} -> {labels['head']}: {comparison.summary()}; single device: "
               f"{single['verdict']}; parallel: base {parity['base']['tally'] or 'none'}, head "
               f"{parity['head']['tally'] or 'none'}")
    markdown = _markdown(summary, comparison, single, parity, repros, labels, captured, timings)
    markdown += coverage.markdown
    (report_dir / "matrix.md").write_text(markdown, encoding="utf-8")
    (report_dir / "index.html").write_text(_page(summary, comparison, single, parity, repros, labels)
                                           + ab_coverage.page_section(coverage), encoding="utf-8")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as handle:
            handle.write(markdown + "\n")
    lines = [summary, *_terminal(comparison, cases, single, parity, repros, captured), *coverage.lines]
    lines.append(f"wrote {report_dir / 'index.html'}, {report_dir / 'matrix.md'}, {comparison.page}"
                 + (f"; exit 1: {comparison.why_exit_1}" if comparison.exit_code else ""))
    lines.append("time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items()))
    return Report(lines, comparison.exit_code)


def single_device(base: list[CaseResult], head: list[CaseResult]) -> dict:
    """The head's fp32 single-device cases (against the base's reference) beside the base's own; where the plan has
    no single-device case of a model, shape, kind, backend and mode, the single-device run measured inside one of its
    parallel cases (the figure its kind marks SINGLE_DEVICE), the head's beside the base's."""
    twins = {case.case_id: case for case in base}
    singles = [case for case in head if case.world_size == 1 and case.dtype == "fp32"]
    rows = [(case.case_id, _figures(twins.get(case.case_id)), _figures(case)) for case in singles]
    errors = [figure[1] for figure in map(key_figure, singles) if figure]
    have = {_runs_alike(case) for case in singles}
    for case in head:
        figure = with_role(case.figures, SINGLE_DEVICE)
        if figure is None or case.dtype != "fp32" or _runs_alike(case) in have:
            continue
        have.add(_runs_alike(case))
        rows.append((f"{case.case_id} (its single-device run)", _single_run(twins.get(case.case_id)),
                     _single_run(case)))
        errors.append(float(figure["value"]))
    changed = [case.case_id for case in singles if case.status is Status.FAIL
               and (twins.get(case.case_id) is None or twins[case.case_id].status is not Status.FAIL)]
    worst = max(errors, default=None)
    verdict = ("the model itself changed: " + ", ".join(changed) if changed else
               "unchanged" + (f" (largest error {worst:.3g})" if worst is not None else "") if rows else
               "not measured (no single-device case in the plan)")
    moved = _moved(head)
    if moved:  # the first module that moved between the revisions, however far inside the tolerance
        verdict += "; moved off the base's references: " + "; ".join(f"{key} first at {line}" for key, line in moved)
    return {"rows": rows, "changed": changed, "verdict": verdict, "moved": moved}


def _moved(head: list[CaseResult]) -> list[tuple[str, str]]:
    """(model@shape kind, the first module that moved) of each reference the head's one device left (the base's
    references, harness.engine.drift), once each."""
    found: dict[str, str] = {}
    for case in head:
        line = reference_drift.moved(case)
        if line is not None:
            found.setdefault(f"{case.model}@{case.shape} {case.kind}", line)
    return list(found.items())


def _runs_alike(case: CaseResult) -> tuple[str, ...]:
    """What a case's single-device run is the same for: all but its layout and dtype."""
    return case.model, case.shape, case.kind, case.backend, case.mode


def _single_run(case: CaseResult | None) -> str:
    """The single-device run measured inside a parallel case, as `name=value` ("-" where there is none)."""
    figure = with_role(case.figures, SINGLE_DEVICE) if case is not None else None
    return "-" if figure is None else f"{figure['name']}={figure['value']:.3g}"


def parity_of(cases: list[CaseResult]) -> dict:
    """The parallel cases' statuses, and, per kind, the fp32 case whose layout is furthest from its own
    single-device run (the figure its kind marks PARITY): {kind: (value, case id)}."""
    parallel = [case for case in cases if case.world_size > 1]
    worst: dict[str, tuple[float, str]] = {}
    for case in parallel:
        figure = with_role(case.figures, PARITY)
        if figure is not None and case.dtype == "fp32":
            entry = (float(figure["value"]), case.case_id)
            worst[case.kind] = max(worst.get(case.kind, entry), entry)
    return {"tally": tally(parallel), "worst": worst}


def parity_text(worst: dict[str, tuple[float, str]], code: str = "") -> str:
    """`tensor 2.4e-07 (flux/ulysses2/native/fp32/tensor)` per kind; `code` quotes the case id (Markdown)."""
    return ", ".join(f"{kind} {value:.3g} ({code}{case_id}{code})" for kind, (value, case_id) in worst.items())


def write_repros(report_dir: Path, side: str, env, cases: list[CaseResult]) -> list[tuple[str, str]]:
    """(case id, the command that runs its script with this side's diffusers) for each FAIL; or why not scripted."""
    from harness.versions.repro import run_command, write_repro

    references = report_dir / ("references" if side == "base" else "head/references")
    found = []
    for case in [case for case in cases if case.status is Status.FAIL][:MOST_REPROS]:
        try:
            out, _ = write_repro(case.case_id, report_dir / "repro" / side / _script_name(case.case_id),
                                 {"references": str(references)})
        except HarnessError as error:
            found.append((case.case_id, f"not scripted: {error}"))
            continue
        found.append((case.case_id, run_command(out, case.world_size, str(env.python))))
    return found


def _script_name(case_id: str) -> str:
    return case_id.replace("/", "-").replace("@", "-") + ".py"


def _figures(case: CaseResult | None) -> str:
    return "-" if case is None else status_line(case)


def _terminal(comparison, cases, single, parity, repros, captured) -> list[str]:
    by_id = {side: {case.case_id: case for case in cases[side]} for side in cases}
    lines = [f"  {change['old']} -> {change['new']}  {change['case_id']}  (base: "
             f"{_figures(by_id['base'].get(change['case_id']))}; head: "
             f"{_figures(by_id['head'].get(change['case_id']))})" for change in comparison.changed]
    lines += comparison.lines()
    lines += [f"single device, head against the base's reference: {single['verdict']}"]
    lines += [f"  {label}: base {before}; head {after}" for label, before, after in single["rows"]]
    for side in ("base", "head"):
        worst = parity[side]["worst"]
        lines.append(f"parallel parity, {side}: {parity[side]['tally'] or 'no parallel case'}"
                     + (f"; worst fp32 layout against its own single-device run: {parity_text(worst)}"
                        if worst else ""))
    lines += [f"repro ({side}) {case_id}: {command}" for side in repros for case_id, command in repros[side]]
    if captured:
        lines.append(f"note: the base has no reference for {', '.join(captured)} (its diffusers lacks the model?): "
                     "the head captured its own, so those cases compare the head with itself")
    return lines


def _markdown(summary, comparison, single, parity, repros, labels, captured, timings) -> str:
    lines = [f"## {summary}", "", f"base: {labels['base']} · head: {labels['head']}", "", "### Status changes", "",
             changed_markdown(comparison), *_known_markdown(comparison),
             "### Single device: the head against the base's reference", "",
             f"{single['verdict']}", "", "| case | base | head |", "|---|---|---|"]
    lines += [f"| `{label}` | {before} | {after} |" for label, before, after in single["rows"]]
    lines += ["", "### Parallel parity (each layout against its own revision's single-device run)", ""]
    for side in ("base", "head"):
        worst = parity[side]["worst"]
        lines.append(f"- {side}: {parity[side]['tally'] or 'no parallel case'}"
                     + (f"; worst fp32 layout {parity_text(worst, '`')}" if worst else ""))
    if any(repros.values()):
        lines += ["", "### Repro scripts (standalone: torch and diffusers only)", ""]
        lines += [f"- {side} `{case_id}`: `{command}`" for side in repros for case_id, command in repros[side]]
    if captured:
        lines += ["", f"Captured by the head (the base has no reference): {', '.join(captured)}"]
    lines += ["", "Time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())]
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"


def _known_markdown(comparison: ab_known.AbComparison) -> list[str]:
    """The known regressions as a list under their own heading (none: nothing)."""
    heading = "accepted with --accept-known" if comparison.accepted else "passed on the base, excused on the head"
    return ([f"### Known regressions ({heading})", "", *(f"- {line.strip()}" for line in comparison.lines()), ""]
            if comparison.known else [])


def _page(summary, comparison, single, parity, repros, labels) -> str:
    esc = html.escape
    rows = "".join(f"<tr><td><code>{esc(c['case_id'])}</code></td><td>{esc(c['old'])}</td><td>{esc(c['new'])}"
                   f"</td><td>{esc(c['new_reason'] or c['old_reason'])}</td></tr>" for c in comparison.changed)
    known = "".join(f"<li>{esc(line.strip())}</li>" for line in comparison.lines())
    single_rows = "".join(f"<tr><td><code>{esc(label)}</code></td><td>{esc(before)}</td><td>{esc(after)}</td></tr>"
                          for label, before, after in single["rows"])
    sides = "".join(f"<li>{side} ({esc(labels[side])}): {esc(parity[side]['tally'] or 'no parallel case')} "
                    f"(<a href='{side}/index.html'>its report</a>)</li>" for side in ("base", "head"))
    scripts = "".join(f"<li>{side} <a href='repro/{side}/{esc(_script_name(case_id))}'><code>{esc(case_id)}</code>"
                      f"</a>: <code>{esc(command)}</code></li>" for side in repros for case_id, command in repros[side]
                      if not command.startswith("not scripted"))
    return (f"<!doctype html><meta charset='utf-8'><title>harness ab</title><h1>{esc(summary)}</h1>"
            f"<h2>Status changes (<a href='compare.html'>compare.html</a>)</h2><table border=1><tr><th>case</th>"
            f"<th>base</th><th>head</th><th>reason</th></tr>{rows}</table>"
            + (f"<h2>Known regressions</h2><ul>{known}</ul>" if known else "") +
            f"<h2>Single device: the head against the base's reference</h2><p>{esc(single['verdict'])}</p>"
            f"<table border=1><tr><th>case</th><th>base</th><th>head</th></tr>{single_rows}</table>"
            f"<h2>Parallel parity</h2><ul>{sides}</ul>" + (f"<h2>Repro scripts</h2><ul>{scripts}</ul>"
                                                           if scripts else ""))
