"""The GPU check's summary: what ran and how it ended, step by step, read from each part's results.json.

It is written whatever happened (a part that crashed or ran out of time has a row saying so), short enough to be
committed under benchmarks/gpu/ and pasted into the README, and it puts the measured seconds beside the dry run's
estimate so the next estimate can use them. The standard library and the harness's own records (harness.core.results
and harness.core.header, which import nothing else), read from this checkout: it runs before the harness's
environment exists, and after it failed.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the harness of this checkout

from harness.core.errors import HarnessError  # noqa: E402  (after the path above)
from harness.core.header import RunHeader  # noqa: E402
from harness.core.results import RESULTS_FILE, CaseResult, Status, read_results  # noqa: E402

# The order the tables show the statuses in: what passed, what needs a look, what was excused or not run.
STATUSES = (Status.PASS, Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.XPASS, Status.XFAIL, Status.SKIP)
SHOWN_FAILURES = 40


@dataclass
class Part:
    """What one part's run wrote: its header and cases; `partial`: only the cases a run cut short finished."""

    header: RunHeader
    cases: list[CaseResult]
    partial: bool = False


def _results(out: Path, name: str) -> Part | None:
    """A part's results.json; for a part cut short, the cases it finished (results.partial.jsonl), marked so."""
    try:
        return Part(*read_results(out / name / RESULTS_FILE))
    except HarnessError:
        return _finished(out / name)


def _finished(folder: Path) -> Part | None:
    """The cases a run cut short finished, from its results.partial.jsonl (None without one)."""
    try:
        lines = (folder / "results.partial.jsonl").read_text(errors="replace").splitlines()[1:]
    except OSError:
        return None
    cases = []
    for line in lines:
        try:
            cases.append(CaseResult.from_dict(json.loads(line)))
        except (ValueError, TypeError):  # the line a killed run was writing
            continue
    return Part(RunHeader.from_dict({}), cases, partial=True)


def _counts(cases: list[CaseResult]) -> str:
    counts = Counter(case.status for case in cases)
    return ", ".join(f"{counts[status]} {status}" for status in STATUSES if counts[status]) or "no cases"


def _cell(cases: list[CaseResult]) -> str:
    counts = Counter(case.status for case in cases)
    shown = [f"{counts[status]} {status}" for status in STATUSES if counts[status] and status is not Status.SKIP]
    return ", ".join(shown) or ("SKIP" if cases else "")


def _short(text: str | None, limit: int = 160) -> str:
    text = " ".join((text or "").split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def backend_table(cases: list[CaseResult]) -> list[str]:
    """Rows backend, columns kind x dtype, each cell the statuses of its cases (SKIP-only backends left out)."""
    columns = sorted({(case.kind, case.dtype) for case in cases if case.backend != "-"})
    by_backend = defaultdict(lambda: defaultdict(list))
    for case in cases:
        if case.backend != "-":
            by_backend[case.backend][(case.kind, case.dtype)].append(case)
    ran = [name for name, cells in by_backend.items()
           if any(c.status is not Status.SKIP for cell in cells.values() for c in cell)]
    lines = ["| backend | " + " | ".join(f"{kind} {dtype}" for kind, dtype in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for name in sorted(ran):
        lines.append(f"| {name} | " + " | ".join(_cell(by_backend[name][column]) for column in columns) + " |")
    skipped = sorted(set(by_backend) - set(ran))
    if skipped:
        lines.append(f"\nEvery case SKIP ({len(skipped)} backends): {', '.join(skipped)}.")
    return lines


def layout_table(cases: list[CaseResult]) -> list[str]:
    layouts = sorted({case.layout for case in cases if case.layout != "-"},
                     key=lambda name: (next((c.world_size for c in cases if c.layout == name), 0), name))
    lines = ["| layout | ranks | " + " | ".join(STATUSES) + " |", "|---|---:|" + "---:|" * len(STATUSES)]
    for layout in layouts:
        mine = [case for case in cases if case.layout == layout]
        counts = Counter(case.status for case in mine)
        lines.append(f"| {layout} | {mine[0].world_size} | " + " | ".join(str(counts[s] or "") for s in STATUSES)
                     + " |")
    return lines


def memory_lines(cases: list[CaseResult]) -> list[str]:
    """Peak memory per case (`peak_mem_mb`: torch.cuda.max_memory_allocated on CUDA, the most of any rank)."""
    measured = [case for case in cases if case.peak_mem_mb is not None]
    if not measured:
        return ["No case recorded its peak memory."]
    worst: dict[tuple, CaseResult] = {}
    for case in measured:
        key = (case.model, case.kind)
        if key not in worst or case.peak_mem_mb > worst[key].peak_mem_mb:
            worst[key] = case
    lines = ["| model | kind | most of any case (MiB) | that case | its seconds |", "|---|---|---:|---|---:|"]
    for (model, kind), case in sorted(worst.items()):
        lines.append(f"| {model} | {kind} | {case.peak_mem_mb:.1f} | `{case.case_id}` | {case.seconds or 0:.2f} |")
    return lines


def time_lines(header: RunHeader) -> list[str]:
    lines = ["| where | seconds |", "|---|---:|"]
    for name, value in header.time_breakdown.items():
        if value is not None:
            lines.append(f"| {name} | {value} |")
    return lines


def failure_lines(cases: list[CaseResult]) -> list[str]:
    failing = [case for case in cases if case.status.needs_a_look]
    if not failing:
        return ["None."]
    groups = defaultdict(list)
    for case in failing:
        groups[(case.status.value, _short(case.reason, 300))].append(case.case_id)
    lines = ["| cases | status | reason | ids |", "|---:|---|---|---|"]
    for (status, reason), ids in sorted(groups.items(), key=lambda item: -len(item[1]))[:SHOWN_FAILURES]:
        shown = ", ".join(f"`{case_id}`" for case_id in ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
        lines.append(f"| {len(ids)} | {status} | {reason} | {shown} |")
    return lines


def skip_lines(cases: list[CaseResult], shown: int = 8) -> list[str]:
    reasons = Counter(_short(case.reason, 140) for case in cases if case.status is Status.SKIP)
    lines = [f"- {count} x {reason}" for reason, count in reasons.most_common(shown)]
    if len(reasons) > shown:
        lines.append(f"- ... {len(reasons) - shown} more reasons ({sum(reasons.values())} SKIP in all; matrix.md)")
    return lines or ["- none"]


def write(out: Path, steps: list[dict], facts: dict) -> Path:
    """summary.md and summary.json in `out`; returns the Markdown's path."""
    env, installed = facts.get("environment") or {}, facts.get("installed") or {}
    gpus = env.get("names") or []
    title = f"{gpus[0]} x{len(gpus)}" if gpus else "no GPU"
    code = facts.get("exit_code")
    verdict = {0: "every step that could run finished; failing cases, if any, are findings (below)",
               1: "a harness error: a step crashed, ran out of time or was refused (below)",
               3: "this machine could not run the check (below)"}.get(code, f"exit {code}")
    lines = [f"# GPU check, {facts.get('started', '?')[:10]}: {title}", "",
             f"Exit {code}: {verdict}. {facts.get('wall_s', '?')} s of the {facts.get('budget_s', '?'):.0f} s budget; "
             f"left-over processes: {len(facts.get('left_over_processes') or [])} killed.", ""]
    lines += ["| step | status | seconds | estimate | timeout | detail |", "|---|---|---:|---:|---:|---|"]
    for step in steps:
        estimate = (step.get("extra") or {}).get("estimate") or {}
        lines.append(f"| {step['name']} | {step['status']} | {step['seconds']} | {estimate.get('seconds', '')} | "
                     f"{step.get('timeout_s') or ''} | {_short(step['detail'], 400)} |")
    lines += ["", "## Environment", ""]
    if env:
        memory = ", ".join(f"{mib} MiB" for mib in env.get("memory_mib") or [])
        lines += [f"- Python: `{env.get('python')}` {env.get('version')}",
                  f"- GPUs: {', '.join(gpus) or 'none'}" + (f" ({memory})" if memory else ""),
                  "- path: " + ("the machine's own torch" if env.get("path") == "installed"
                                else "a CUDA torch from the registry")]
    if installed:
        lines += [f"- torch {installed.get('torch')} (CUDA {installed.get('cuda')}, cuDNN {installed.get('cudnn')}), "
                  f"diffusers {installed.get('diffusers')}",
                  "- backend packages: " + ", ".join(f"{name} {installed.get(name) or 'absent'}" for name in
                                                     ("xformers", "kernels", "flash_attn", "sageattention"))]
    parts_json = {}
    for step in steps:
        part = _results(out, step["name"])
        if part is None:
            continue
        cases, header = part.cases, part.header
        extra = step.get("extra") or {}
        parts_json[step["name"]] = {"counts": header.counts or None, "time_breakdown": header.time_breakdown or None,
                                    "estimate": extra.get("estimate"), "seconds": step["seconds"]}
        lines += ["", f"## {step['name']}: {extra.get('title', '')}", "",
                  f"`harness run {' '.join(extra.get('args') or [])}`", "",
                  (f"Cut short: only the cases it finished (`{step['name']}/results.partial.jsonl`). "
                   f"**{_counts(cases)}** ({len(cases)} cases; exit {step['rc']}, {step['status']})."
                   if part.partial else
                   f"**{_counts(cases)}** ({len(cases)} cases; exit {step['rc']}, {step['status']}). Reports: "
                   f"`{step['name']}/` (matrix.csv with `seconds` and `peak_mem_mb` per case, matrix.md, "
                   "results.json, index.html)."), "", "By backend (kind x dtype):", "", *backend_table(cases), "",
                  "By layout:", "", *layout_table(cases), "", "Failing cases, by reason:", "", *failure_lines(cases),
                  "", "SKIP, by reason:", "", *skip_lines(cases), "", "Time (`time_breakdown`):", "",
                  *time_lines(header), "", "Peak memory per case (MiB; `torch.cuda.max_memory_allocated` on CUDA):",
                  "", *memory_lines(cases)]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps({"facts": facts, "steps": steps, "parts": parts_json}, indent=1,
                                                 default=str) + "\n")
    return out / "summary.md"
