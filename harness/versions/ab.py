"""`harness ab --base REV --head REV [plan options]`: the same plan on two diffusers revisions, one report.

Each revision gets its environment (harness.versions.envs). The base runs the plan with references it captures
itself (`<report-dir>/references`, reused by the next `ab` while the base revision and the harness's code are the
same); the head runs the same plan against a copy of those references. So the head's single-device cases measure
the head's model against the base's (the model itself changed), while the figure a kind marks PARITY
(harness.core.figures; the tensor kind's `vs_baseline_max_abs`) measures a layout against its own revision's
single-device run (the parallel parity of that side). `harness report --compare`'s
logic (harness.report.compare) gives the status changes; a regression exits 1, and so does a case that passed on
the base and is XFAIL on the head unless `--accept-known` (harness.versions.ab_known).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from harness.run.settings import OPTIONS
from harness.versions import ab_report
from harness.versions.envs import Env, env_for
from harness.versions.revisions import parse_revision
from harness.versions.sides import run_harness

STAMP = "revision.json"


def ab(base_text: str, head_text: str, flags: list[str], report_dir: Path, cache: Path,
       echo: Callable[[str], None] = print, accept_known: bool = False) -> int:
    base, head = parse_revision(base_text), parse_revision(head_text)  # both checked before anything is built
    clock, timings = time.monotonic(), {}
    envs = {}
    for side, revision in (("base", base), ("head", head)):
        envs[side] = env_for(revision, cache, echo)
        timings[f"{side} environment"] = envs[side].built_s or 0.0
    flags = with_single(flags, echo)
    references = base_references(report_dir / "references", envs["base"], echo)
    head_references = report_dir / "head" / "references"
    for side in ("base", "head"):
        if side == "head":  # only now does the base's folder hold what the base's run captured
            _copy(references, head_references)
        refs = references if side == "base" else head_references
        started = time.monotonic()
        echo(f"ab: {side}: {envs[side].revision.label}: harness run -> {report_dir / side}")
        run_harness(envs[side], ["run", *flags, f"--references={refs}", f"--report-dir={report_dir / side}"],
                    report_dir / f"{side}.log", echo, prefix=f"{side} | ")
        timings[f"{side} run"] = round(time.monotonic() - started, 1)
    captured = sorted(str(path.relative_to(head_references)) for path in head_references.rglob("*.safetensors")
                      if not (references / path.relative_to(head_references)).exists())
    timings["total"] = round(time.monotonic() - clock, 1)
    report = ab_report.write(report_dir, envs, captured, timings, accept_known)
    for line in report.lines:
        echo(line)
    return report.exit_code


def with_single(flags: list[str], echo: Callable[[str], None]) -> list[str]:
    """The plan's flags with the `single` layout in every layout list given (`--layouts` and a kind's own): the
    head's single-device output against the base's reference is what tells a changed model from a parallel bug."""
    layout_lists = {f"--{key.replace('_', '-')}" for key, option in OPTIONS.items() if option.name == "layouts"}
    out = []
    for flag in flags:
        name, _, value = flag.partition("=")
        if name in layout_lists and "single" not in value.split(","):
            echo(f"ab: {name} gets the single layout too (the head's single-device output against the base's "
                 "reference shows whether the model itself changed)")
            flag = f"{name}=single,{value}"
        out.append(flag)
    return out


def base_references(folder: Path, env: Env, echo: Callable[[str], None]) -> Path:
    """The base's reference folder: kept when it was captured by the same base revision and harness code, else
    emptied (the base's run captures what its plan needs into it)."""
    stamp = {"revision": env.revision.label, "environment": env.info.get("key"),
             "source": env.revision.key_material(), "harness_code": _harness_code()}
    path = folder / STAMP
    if folder.exists():
        try:
            kept = json.loads(path.read_text()) == stamp
        except (OSError, ValueError):
            kept = False
        if kept:
            echo(f"ab: reusing the base's references in {folder}")
            return folder
        echo(f"ab: {folder} holds references of another revision or harness; capturing the base's anew")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    path.write_text(json.dumps(stamp, indent=1))
    return folder


def _harness_code() -> str:
    """What the references depend on besides diffusers: the harness's own code (specs, kinds, the file format)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for source in sorted(root.rglob("*.py")):
        digest.update(source.relative_to(root).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def _copy(references: Path, target: Path) -> Path:
    """A copy of the base's references for the head's run: what the head captures (a model the base lacks) goes
    there, never into the base's, and is named in the report."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(references, target, ignore=shutil.ignore_patterns(STAMP))
    return target
