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
from harness.report.compare import changed_markdown, status_tally
from harness.report.compare_page import compare_runs
from harness.versions import ab_coverage
from harness.versions.sides import key_figure, results, status_line

MOST_REPROS = 20  # scripts written per side; more FAILs are listed by the matrix


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)  # what the terminal shows, the summary first
    exit_code: int = 0


def write(report_dir: Path, envs: dict, captured: list[str], timings: dict) -> Report:
    comparison = compare_runs(report_dir / "base", report_dir / "head", out_dir=report_dir)
    read = {side: results(report_dir / side) for side in ("base", "head")}
    cases = {side: read[side][1] for side in read}
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
                 + ("; exit 1: a case newly fails" if comparison.exit_code else ""))
    lines.append("time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items()))
    return Report(lines, comparison.exit_code)


def single_device(base: list[dict], head: list[dict]) -> dict:
    """The head's fp32 single-device cases (against the base's reference) beside the base's own, and the train
    cases' single-device baselines where the plan has no single train case."""
    twins = {case["case_id"]: case for case in base}
    rows = [(case["case_id"], twins.get(case["case_id"]), case) for case in head
            if case["layout"] == "single" and case["dtype"] == "fp32"]
    have = {(case["model"], case["shape"], case["kind"], case["backend"]) for _, _, case in rows}
    for case in head:
        baseline = ((((case.get("extra") or {}).get("train") or {}).get("noise")) or {}).get("single")
        key = (case["model"], case["shape"], case["kind"], case["backend"])
        if baseline and case["dtype"] == "fp32" and key not in have:
            have.add(key)
            rows.append((f"{case['case_id']} (its single-device run)", None,
                         {"status": "", "reason": "", "figures": [{"name": "grad_err", "cell": "g{value:.0e}",
                                                                   "value": baseline.get("grad_err")}]}))
    changed = [case_id for case_id, before, after in rows
               if after["status"] == "FAIL" and (before is None or before["status"] != "FAIL")]
    worst = max((key_figure(after)[1] for _, _, after in rows if key_figure(after)), default=None)
    verdict = ("the model itself changed: " + ", ".join(changed) if changed else
               "unchanged" + (f" (largest error {worst:.3g})" if worst is not None else "") if rows else
               "not measured (no single-device case in the plan)")
    return {"rows": rows, "changed": changed, "verdict": verdict}


def parity_of(cases: list[dict]) -> dict:
    """The parallel cases' statuses, and how far the worst fp32 tensor layout is from its own single-device run."""
    parallel = [case for case in cases if (case.get("world_size") or 1) > 1]
    measured = [(case["extra"]["vs_baseline_max_abs"], case["case_id"]) for case in parallel
                if case["dtype"] == "fp32" and isinstance((case.get("extra") or {}).get("vs_baseline_max_abs"),
                                                           int | float)]
    return {"tally": status_tally(parallel), "worst": max(measured, default=None)}


def write_repros(report_dir: Path, side: str, env, cases: list[dict]) -> list[tuple[str, str]]:
    """(case id, the command that runs its script with this side's diffusers) for each FAIL; or why not scripted."""
    from harness.versions.repro import run_command, write_repro

    references = report_dir / ("references" if side == "base" else "head/references")
    found = []
    for case in [case for case in cases if case["status"] == "FAIL"][:MOST_REPROS]:
        try:
            out, _ = write_repro(case["case_id"], report_dir / "repro" / side / _script_name(case["case_id"]),
                                 {"references": str(references)})
        except HarnessError as error:
            found.append((case["case_id"], f"not scripted: {error}"))
            continue
        found.append((case["case_id"], run_command(out, case["world_size"], str(env.python))))
    return found


def _script_name(case_id: str) -> str:
    return case_id.replace("/", "-").replace("@", "-") + ".py"


def _figures(case: dict | None) -> str:
    return "-" if case is None else status_line(case)


def _terminal(comparison, cases, single, parity, repros, captured) -> list[str]:
    by_id = {side: {case["case_id"]: case for case in cases[side]} for side in cases}
    lines = [f"  {change['old']} -> {change['new']}  {change['case_id']}  (base: "
             f"{_figures(by_id['base'].get(change['case_id']))}; head: "
             f"{_figures(by_id['head'].get(change['case_id']))})" for change in comparison.changed]
    lines += [f"single device, head against the base's reference: {single['verdict']}"]
    lines += [f"  {case_id}: base {_figures(before)}; head {_figures(after)}" for case_id, before, after
              in single["rows"]]
    for side in ("base", "head"):
        worst = parity[side]["worst"]
        lines.append(f"parallel parity, {side}: {parity[side]['tally'] or 'no parallel case'}"
                     + (f"; worst fp32 layout against its own single-device run: {worst[0]:.3g} ({worst[1]})"
                        if worst else ""))
    lines += [f"repro ({side}) {case_id}: {command}" for side in repros for case_id, command in repros[side]]
    if captured:
        lines.append(f"note: the base has no reference for {', '.join(captured)} (its diffusers lacks the model?): "
                     "the head captured its own, so those cases compare the head with itself")
    return lines


def _markdown(summary, comparison, single, parity, repros, labels, captured, timings) -> str:
    lines = [f"## {summary}", "", f"base: {labels['base']} · head: {labels['head']}", "", "### Status changes", "",
             changed_markdown(comparison), "### Single device: the head against the base's reference", "",
             f"{single['verdict']}", "", "| case | base | head |", "|---|---|---|"]
    lines += [f"| `{case_id}` | {_figures(before)} | {_figures(after)} |" for case_id, before, after in single["rows"]]
    lines += ["", "### Parallel parity (each layout against its own revision's single-device run)", ""]
    for side in ("base", "head"):
        worst = parity[side]["worst"]
        lines.append(f"- {side}: {parity[side]['tally'] or 'no parallel case'}"
                     + (f"; worst fp32 layout {worst[0]:.3g} (`{worst[1]}`)" if worst else ""))
    if any(repros.values()):
        lines += ["", "### Repro scripts (standalone: torch and diffusers only)", ""]
        lines += [f"- {side} `{case_id}`: `{command}`" for side in repros for case_id, command in repros[side]]
    if captured:
        lines += ["", f"Captured by the head (the base has no reference): {', '.join(captured)}"]
    lines += ["", "Time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())]
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"


def _page(summary, comparison, single, parity, repros, labels) -> str:
    esc = html.escape
    rows = "".join(f"<tr><td><code>{esc(c['case_id'])}</code></td><td>{esc(c['old'])}</td><td>{esc(c['new'])}"
                   f"</td><td>{esc(c['new_reason'] or c['old_reason'])}</td></tr>" for c in comparison.changed)
    single_rows = "".join(f"<tr><td><code>{esc(case_id)}</code></td><td>{esc(_figures(before))}</td>"
                          f"<td>{esc(_figures(after))}</td></tr>" for case_id, before, after in single["rows"])
    sides = "".join(f"<li>{side} ({esc(labels[side])}): {esc(parity[side]['tally'] or 'no parallel case')} "
                    f"(<a href='{side}/index.html'>its report</a>)</li>" for side in ("base", "head"))
    scripts = "".join(f"<li>{side} <a href='repro/{side}/{esc(_script_name(case_id))}'><code>{esc(case_id)}</code>"
                      f"</a>: <code>{esc(command)}</code></li>" for side in repros for case_id, command in repros[side]
                      if not command.startswith("not scripted"))
    return (f"<!doctype html><meta charset='utf-8'><title>harness ab</title><h1>{esc(summary)}</h1>"
            f"<h2>Status changes (<a href='compare.html'>compare.html</a>)</h2><table border=1><tr><th>case</th>"
            f"<th>base</th><th>head</th><th>reason</th></tr>{rows}</table>"
            f"<h2>Single device: the head against the base's reference</h2><p>{esc(single['verdict'])}</p>"
            f"<table border=1><tr><th>case</th><th>base</th><th>head</th></tr>{single_rows}</table>"
            f"<h2>Parallel parity</h2><ul>{sides}</ul>" + (f"<h2>Repro scripts</h2><ul>{scripts}</ul>"
                                                           if scripts else ""))
