"""How big index.html and results.json are, and how fast the page is interactive, on a synthetic run of the full
plan's size (benchmarks/full_plan.py: 22,800 cases with the real kinds' figures, failed checks, detail blocks and
tracebacks).

It writes results.json as `harness run` does, renders index.html, prints their sizes, and loads the page in headless
Chromium several times: the page script stamps `performance.now()` on <html data-ready-ms> once the page is
interactive, read back with `--dump-dom`. It also estimates the images folder: the committed reference PNGs stand in
for candidates (bf16/fp16 ones with a little noise, as their pictures differ slightly), written four per case as the
worker does, then pruned as `harness.report.images.prune_images` does after each case. Usage:

    python benchmarks/bench_report.py [--runs 5] [--keep DIR] [--failing N]

Prints a Markdown table for the docs (docs/measured.md). A benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.core.evidence import Evidence, reason  # noqa: E402
from harness.core.header import RunHeader  # noqa: E402
from harness.core.results import RESULTS_FILE, CaseResult, Status, write_results  # noqa: E402
from harness.report import render_html  # noqa: E402
from harness.report.images import prune_images  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
_spec = importlib.util.spec_from_file_location("full_plan", Path(__file__).with_name("full_plan.py"))
full_plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(full_plan)
KNOWN = "known_issues.toml #{}"


def judge(case: CaseResult, rng: random.Random) -> CaseResult:
    """A status and everything a real run records with it."""
    why = full_plan.skip_reason(case)
    if why is not None:
        case.status, case.reason = Status.SKIP, why
        return case
    issue = full_plan.known_issue(case)
    if issue is not None and issue[0] == "raising":
        text, error = full_plan.RAISING[issue[1]]
        key = KNOWN.format(list(full_plan.RAISING).index(issue[1]) + 1)
        case.status, case.reason = Status.XFAIL, f"known issue: {text}{full_plan.URL}; observed {error}"
        case.evidence = [Evidence("error", error).to_dict() | {"known": key}]
        case.extra.update({"phases": {"model build": 0.008, "parallel setup": 0.001}, "known_issue": [key],
                           "traceback": full_plan.traceback_text(case.model, error), "observed": f"ERROR: {error}"})
        return case
    full_plan.run_extras(case, rng)
    figures_of(case, rng, 1.0 if issue is None else 3e3)
    if issue is None:
        return case
    text, checks = full_plan.SILENT[issue[1]]
    key = KNOWN.format(len(full_plan.RAISING) + list(full_plan.SILENT).index(issue[1]) + 1)
    items = failed_checks(case, checks, rng)
    case.status = Status.XFAIL
    case.reason = f"known issue: {text}{full_plan.URL}; observed {reason(items)}"
    case.evidence = [item.to_dict() | {"known": key} for item in items]
    case.extra.update({"known_issue": [key], "observed": f"FAIL: {reason(items)}"})
    return case


def figures_of(case: CaseResult, rng: random.Random, scale: float) -> None:
    if case.kind == "tensor":
        full_plan.tensor_figures(case, rng, scale)
    elif case.kind == "image":
        full_plan.image_figures(case, rng)
    else:
        full_plan.train_figures(case, rng, scale)


def failed_checks(case: CaseResult, checks: tuple[str, ...], rng: random.Random) -> list[Evidence]:
    """The failed checks of a silently wrong case: one for the case as a whole, or one per parameter (a train
    case's gradients and weights: up to 76 parameters each), worst first."""
    items = []
    for check in checks:
        if check in ("max_abs", "loss_rel"):
            value = rng.uniform(0.2, 0.4)
            items.append(Evidence(check, f"{check}: {value:.3g} > 1e-05", "", value, 1e-5))
            continue
        subjects = rng.sample(full_plan.PARAMS, rng.randrange(6, len(full_plan.PARAMS)))
        values = sorted((rng.uniform(0.01, 1.0) for _ in subjects), reverse=True)
        items += [Evidence(check, f"{check} of {name} {value:.3g} > 0.0001", name, value, 1e-4)
                  for name, value in zip(subjects, values, strict=True)]
    return items


def make_failing(cases: list[CaseResult], count: int, rng: random.Random) -> None:
    """Turn `count` passing cases into the cases that matter: FAIL (figures, images), ERROR, TIMEOUT and XPASS."""
    passing = [case for case in cases if case.status is Status.PASS]
    for index, case in enumerate(rng.sample(passing, count)):
        status = ("FAIL", "FAIL", "ERROR", "TIMEOUT", "XPASS", "FAIL")[index % 6]
        if status == "FAIL":
            figures_of(case, rng, 3e4 if case.dtype == "fp32" else 8)
            first = case.figures[0]
            item = Evidence("limit", f"{first['label']} {first['value']:.3g} > {first.get('limit', 0):.3g}", "",
                            first["value"], first.get("limit"))
            case.status, case.reason, case.evidence = Status.FAIL, item.text, [item.to_dict()]
        elif status == "ERROR":
            error = f"RuntimeError: shape '[1, 24, 3, 1, {index}]' is invalid for input of size 1152"
            case.status, case.reason, case.figures = Status.ERROR, f"rank 1: {error}", []
            case.evidence = [Evidence("error", f"rank 1: {error}").to_dict()]
            case.extra = {"traceback": full_plan.traceback_text(case.model, error)}
        elif status == "TIMEOUT":
            case.status, case.reason, case.figures, case.extra = (Status.TIMEOUT, "case timeout: no result after "
                                                                  "120 s", [], {})
        else:
            case.status = Status.XPASS
            case.reason = f"known issue no longer reproduces (XPASS): {full_plan.RAISING['lse'][0]}"


def synthetic_cases(failing: int = 12, seed: int = 0) -> list[CaseResult]:
    """The whole synthetic full-plan run: every case judged, `failing` of the passing ones made to matter."""
    rng = random.Random(seed)
    cases = [judge(case, rng) for case in full_plan.plan()]
    make_failing(cases, failing, rng)
    return cases


def header() -> RunHeader:
    env = {"torch": "2.13.0+cpu", "diffusers": "0.42.1", "diffusers_commit": None, "python": "3.11.7",
           "device": "cpu (x86_64)"}
    return RunHeader(env, env, "", {}, {"plan": "full", "case_timeout": 0.0, "cpu_max_ranks": 4}, {}, [],
                     "2026-01-01T00:00:00", 5321.0, 8)


def write_run(folder: Path, cases: list[CaseResult]) -> Path:
    """results.json as `harness run` writes it (each traceback once)."""
    write_results(folder / RESULTS_FILE, cases, header())
    return folder


def ready_ms(index: Path, profile: Path) -> tuple[float, float]:
    """One cold load in headless Chromium: the page's own ready stamp (ms since navigation start) and the wall time
    of the whole browser process (start, load, dump, exit) for scale."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1280,1400", "--dump-dom", index.as_uri()]
    started = time.perf_counter()
    done = subprocess.run([str(CHROMIUM), *flags], capture_output=True, text=True, timeout=300, check=False)
    wall = time.perf_counter() - started
    found = re.search(r'data-ready-ms="([0-9.]+)"', done.stdout)
    if not found:
        raise SystemExit(f"no ready stamp in the dumped page (exit {done.returncode}): {done.stderr[-1000:]}")
    return float(found.group(1)), wall * 1000


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def image_estimate(cases: list[CaseResult], scratch: Path, policy: str) -> tuple[int, int]:
    """(files, bytes) of the images folder after every image case of `cases` wrote its four PNGs and was pruned
    with `policy`: the committed reference pictures stand in for the model's candidates."""
    import numpy as np
    from PIL import Image

    folder = scratch / f"images-{policy}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for case in cases:
        if case.kind != "image" or "images" not in case.extra:
            continue
        picture = np.asarray(Image.open(ROOT / "references" / case.model / "image.png").convert("RGB"), dtype=float)
        noisy = picture + (rng.normal(0, 2.0, picture.shape) if case.dtype != "fp32" else 0)
        diff = np.clip(np.abs(noisy - picture) * 10, 0, 255)
        ssim_map = np.full(picture.shape, 255.0 if case.dtype == "fp32" else 250.0)
        result = CaseResult.from_dict(case.to_dict())
        for name, pixels in (("reference", picture), ("candidate", noisy), ("diff", diff), ("ssim_map", ssim_map)):
            path = folder / Path(result.extra["images"][name]).name
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path)
        prune_images(result, folder, policy)
    return sum(1 for _ in folder.iterdir()), folder_size(folder)


def quick_like(cases: list[CaseResult], count: int = 128) -> list[CaseResult]:
    """About the quick plan's image cases: flux, flux2 and qwenimage, fp32 and bf16, passing."""
    picked = [c for c in cases if c.kind == "image" and c.model in ("flux", "flux2", "qwenimage")
              and c.dtype in ("fp32", "bf16") and c.backend in full_plan.CPU_BACKENDS and "images" in c.extra]
    return picked[:count]


def measure(cases: list[CaseResult], folder: Path, scratch: Path, runs: int) -> list[tuple[str, str]]:
    """(figure, value) rows: sizes, render time, time to interactive, images folder estimates."""
    write_run(folder, cases)
    started = time.perf_counter()
    index = render_html(folder)
    render_s = time.perf_counter() - started
    tally = {status.value: sum(c.status is status for c in cases) for status in Status}
    rows = [("cases (synthetic full plan)", f"{len(cases)}: " + ", ".join(f"{n} {s}" for s, n in tally.items())),
            ("results.json", f"{(folder / 'results.json').stat().st_size / 1e6:.1f} MB"),
            ("index.html", f"{index.stat().st_size / 1e6:.2f} MB, rendered in {render_s:.1f} s")]
    if CHROMIUM.exists() and runs:
        stamps = [ready_ms(index, scratch / f"profile{i}") for i in range(runs)]
        ready, wall = statistics.median(s[0] for s in stamps), statistics.median(s[1] for s in stamps)
        rows.append((f"interactive in headless Chromium (median of {runs} cold loads)",
                     f"{ready:.0f} ms after navigation start ({wall:.0f} ms for the whole browser process)"))
    passing = [c for c in cases if not c.status.is_bad]
    count = sum(1 for c in passing if c.kind == "image" and "images" in c.extra)
    for policy in ("failing", "all"):
        files, size = image_estimate(passing, scratch, policy)
        rows.append((f"images folder, {count} passing image cases, `--images {policy}`",
                     f"{files} files, {size / 1e6:.2f} MB"))
    quick = quick_like(cases)
    files, size = image_estimate(quick, scratch, "failing")
    rows.append((f"images folder, {len(quick)} quick-plan-like image cases, `--images failing`",
                 f"{files} files, {size / 1e6:.2f} MB"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="cold Chromium loads to take the median of")
    parser.add_argument("--failing", type=int, default=12, help="cases turned into FAIL/ERROR/TIMEOUT/XPASS")
    parser.add_argument("--keep", type=Path, help="write the run here and keep it (default: a temporary folder)")
    args = parser.parse_args()
    cases = synthetic_cases(args.failing)
    with tempfile.TemporaryDirectory() as scratch:
        rows = measure(cases, args.keep or Path(scratch) / "run", Path(scratch), args.runs)
    print("| figure | value |\n|---|---|")
    for figure, value in rows:
        print(f"| {figure} | {value} |")


if __name__ == "__main__":
    main()
