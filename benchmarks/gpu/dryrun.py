"""The two steps of the GPU check that run here, on a CPU machine with the registry at hand:

- the dry run (`check.sh --dry-run`): the plan of every part (the harness's own), which cases are expected to run on
  the GPU, every package the GPU run would install checked against the registry (metadata only: no CUDA wheel is
  downloaded), the wheelhouse, and the time estimate against the budget;
- `check.sh --prepare`: the wheelhouse for a GPU machine that has no registry.

Exit 0 when the check is ready; 1 when something it needs is missing (a required package the registry does not have,
a wheelhouse too big to carry) or the estimate does not fit the budget.
"""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import packages
import plan

MULTI_GPU = (2, 4, 8)  # the quick part's estimate on machines with more GPUs (its largest layout has 4 ranks)


def _here() -> str:
    import diffusers
    import torch

    cuda = f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)" if torch.cuda.is_available() else "no GPU"
    return f"python {platform.python_version()}, torch {torch.__version__}, diffusers {diffusers.__version__} ({cuda})"


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_registry(wanted: list[packages.Package], python_version: str, offline: bool) -> tuple[dict, str | None]:
    """name -> Found; and a note when the registry was not asked (--offline) or did not answer."""
    if offline:
        return {}, "not asked (--offline): the packages were not checked against the registry"
    answers, detail = packages.reachable()
    if not answers:
        return {}, f"not reachable ({detail}): the packages were not checked; the plan and estimate stand"
    return {found.package.name: found for found in packages.find_all(wanted, python_version)}, None


def _package_rows(wanted, found, manifest) -> tuple[list[str], list[str]]:
    """Two lines per package (what the registry answered; what the GPU run does with it, and why), and the
    problems: a required package, or one asked for with --with, that the registry does not have."""
    carried = {item["spec"] for item in (manifest or {}).get("packages", [])}
    rows, problems = [], []
    for package in wanted:
        hit = found.get(package.name)
        if hit is None:
            answer = "not checked"
        elif hit.wheel:
            answer = "ok: " + hit.wheel + (f" ({_cuda_of(hit)})" if package.name == "torch" else "")
        else:
            answer = hit.problem
            if package.required or not hit.exists:
                problems.append(f"{package.spec}: {hit.problem}")
        if package.name == "torch":
            use = "installed only where the machine has no CUDA torch, from the registry"
        elif hit is not None and not hit.wheel:
            use = "not installed" + (f": {', '.join(package.backends)} stay SKIP" if package.backends else "")
        elif not package.carried:
            use = "installed only where the registry answers (not carried)"
        else:
            use = "installed from the wheelhouse or the registry" + (
                "" if manifest is None or package.spec in carried else " (not in the wheelhouse yet: --prepare)")
        rows += [f"  {package.spec:24s} {_short(answer, 96)}", f"  {'':24s} -> {use}; {_short(package.why, 80)}"]
    return rows, problems


def _cuda_of(found: packages.Found) -> str:
    """The CUDA a torch wheel is built for, from its requirements (cuda-toolkit, or the nvidia-*-cuNN packages)."""
    for requirement in found.requires:
        if requirement.startswith(("cuda-toolkit", "nvidia-cuda-runtime")):
            return _short(requirement.split(";")[0], 60)
    return "CPU build?" if found.requires else "no requirements listed"


def _wheelhouse_line(manifest: dict | None, limit_mib: float, python_version: str) -> tuple[str, list[str]]:
    if manifest is None:
        return (f"wheelhouse: {packages.WHEELHOUSE.relative_to(plan.REPO)} is absent: a GPU machine without the "
                "registry needs it (`check.sh --prepare` here, then carry that folder)"), []
    size = sum(item["bytes"] for item in manifest["wheels"])
    tree = packages.tracked_bytes()
    line = (f"wheelhouse: {len(manifest['wheels'])} wheels, {size / 2**20:.1f} MiB, for CPython "
            f"{manifest['python_version']}; with the working tree ({tree / 2**20:.1f} MiB) "
            f"{(size + tree) / 2**20:.1f} of the {limit_mib:g} MiB a copy may carry")
    left = [item["wheel"].split("-", 1)[0] for item in manifest.get("left_to_the_machine", [])]
    if left:
        line += f"; left to the machine (wheels over {packages.DEPENDENCY_MIB:g} MiB): {', '.join(left)}"
    problems = [f"wheelhouse: {name} is listed in its manifest but missing" for name in manifest["missing"]]
    if manifest["python_version"] != python_version:
        problems.append(f"wheelhouse: made for CPython {manifest['python_version']}, the GPU machine's is "
                        f"{python_version}: run `check.sh --prepare --python-version {python_version}`")
    if (size + tree) / 2**20 > limit_mib:
        problems.append(line)
    return line, problems


def _part_lines(planned: plan.PlannedPart, gpus: int) -> list[str]:
    counts, here = planned.counts(), Counter("run" if p.runs else "decided" for p, _ in planned.views)
    by_kind = Counter(p.case.kind for p, view in planned.views if view.status == "RUN")
    backends = sorted({p.case.backend for p, view in planned.views if view.status == "RUN"})
    lines = [f"  {planned.part.name}: {planned.part.title}",
             f"    harness run {' '.join(planned.args)}",
             f"    {len(planned.case_ids)} cases; here {here['run']} run and {here['decided']} are decided at plan "
             f"time; on {gpus} GPU(s), predicted: {counts['RUN']} run, {counts['SKIP']} SKIP, {counts['ERROR']} ERROR",
             f"    run by kind: {', '.join(f'{kind} {n}' for kind, n in sorted(by_kind.items())) or 'none'}; "
             f"backends: {', '.join(backends) or 'none'}"]
    reasons, backends_of = Counter(), {}
    for case, view in ((p.case, v) for p, v in planned.views if v.status in ("SKIP", "ERROR")):
        reason = _short(view.reason.replace(f"'{case.backend}'", "'<backend>'")
                        .replace(f"{case.backend} attention", "<backend> attention"), 104)
        reasons[(view.status, reason)] += 1
        backends_of.setdefault((view.status, reason), set()).add(case.backend)
    for (status, reason), count in reasons.most_common(6):
        names = sorted(backends_of[(status, reason)])
        which = f" [{', '.join(names)}]" if "<backend>" in reason else ""
        lines.append(f"      {count:4d} {status} {reason}{_short(which, 200)}")
    if len(reasons) > 6:
        lines.append(f"      ... {len(reasons) - 6} more reasons ({sum(reasons.values())} cases in all)")
    return lines


def dry_run(options) -> int:
    """Print the plan, the packages and the estimate; write them as JSON to `options.json` when given."""
    out = Path(options.out)
    wanted = plan.package_list(options.with_, options.without)
    with ThreadPoolExecutor(max_workers=1) as pool:  # the registry answers while the harness plans
        asking = pool.submit(_check_registry, wanted, options.python_version, options.offline)
        print("GPU check, dry run: what `check.sh` runs on a CUDA machine, planned here; nothing is installed or run")
        print(f"here: {_here()}")
        manifest = packages.read_manifest()
        found, note = asking.result()
    path = "installed CUDA torch" + (", offline from the wheelhouse" if manifest else "")
    usable = plan.usable_on_gpu(found, online=False) if found else _usable_unchecked(manifest)
    planned_parts = plan.plan_parts(out, options.gpus, usable)
    rows, problems = _package_rows(wanted, found, manifest)
    print("\ninstall (the machine's own CUDA torch is used when it has one; without the registry the wheelhouse)")
    print(f"  registry, for CPython {options.python_version} on x86-64 Linux: {note or 'answers'}")
    print("\n".join(rows))
    line, wheel_problems = _wheelhouse_line(manifest, options.carry_limit_mib, options.python_version)
    print(line)
    problems += wheel_problems
    print(f"  expected usable on the GPU ({path}): {', '.join(sorted(usable))}")
    print(f"\nplan ({options.gpus} GPU(s); each part's plan is the harness's own; what runs on the GPU is predicted)")
    for planned in planned_parts:
        print("\n".join(_part_lines(planned, options.gpus)))
    estimate = plan.estimate(planned_parts)
    estimate["budget_s"] = options.budget_s
    fits = estimate["total_s"] <= options.budget_s
    print(f"\nestimate, {options.gpus} GPU(s), {path}:")
    print("  " + ", ".join(f"{item['step']} {item['seconds']:.0f} s" for item in estimate["items"]))
    print(f"  estimate: {estimate['total_s']:.0f} s of the {options.budget_s:.0f} s budget: "
          + (f"fits ({options.budget_s - estimate['total_s']:.0f} s to spare)" if fits else "does NOT fit"))
    multi = _multi_gpu(planned_parts, usable)
    for row in multi:
        each = ", ".join(f"{name} {value:.0f} s" for name, value in row["parts"].items())
        over = "" if row["total_s"] <= options.budget_s else " (over the budget: the last part is cut short there)"
        print(f"  with {row['gpus']} GPUs: {each}; total {row['total_s']:.0f} s{over}")
    print("  assumptions:")
    for assumption in plan.ASSUMPTIONS:
        print(f"    - {assumption}")
    if not fits:
        problems.append(f"the estimate ({estimate['total_s']:.0f} s) does not fit the budget ({options.budget_s:.0f} "
                        "s): take cases out of a part in benchmarks/gpu/plan.py, or give a larger --budget-s")
    if options.json:
        Path(options.json).write_text(json.dumps({
            "parts": [{"name": p.part.name, "args": p.args, "case_ids": p.case_ids, "gpu": dict(p.counts()),
                       "estimate": p.estimate} for p in planned_parts],
            "packages": [found[p.name].to_dict() if p.name in found else {"spec": p.spec, "name": p.name}
                         for p in wanted],
            "registry_note": note, "usable_on_gpu": usable, "estimate": estimate, "multi_gpu": multi,
            "problems": problems}, indent=1))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"\ndry run: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def _usable_unchecked(manifest: dict | None) -> dict[str, str]:
    """Without the registry's answer: PyTorch's own backends, and those whose package the wheelhouse holds."""
    held = {item["spec"].split("=")[0].split(">")[0] for item in (manifest or {}).get("packages", [])}
    usable = {}
    for backend, need in plan.backend_requirements().items():
        if need is None:
            usable[backend] = "PyTorch's own"
        elif isinstance(need, tuple) and need[0] in held:
            usable[backend] = "in the wheelhouse"
    return usable


def _multi_gpu(planned_parts, usable) -> list[dict]:
    """Every part again with 2, 4 and 8 GPUs: the parallel cases run where they fit."""
    rows = []
    for gpus in MULTI_GPU:
        again = []
        for planned in planned_parts:
            views = [(case, plan.gpu_view(case, planned.settings, gpus, usable)) for case, _ in planned.views]
            again.append(replace(planned, views=views, estimate=plan.part_estimate(views, gpus)))
        rows.append({"gpus": gpus, "parts": {p.part.name: p.estimate["seconds"] for p in again},
                     "total_s": plan.estimate(again)["total_s"]})
    return rows


def prepare(options) -> int:
    """Download the wheelhouse: each carried package of the install list that has a wheel for the GPU's Python (an
    optional one without a wheel is left out and named; a required one without a wheel is a problem)."""
    carried = [package for package in plan.package_list(options.with_, options.without) if package.carried]
    answers, detail = packages.reachable()
    if not answers:
        print(f"check.sh: error: --prepare needs the registry, which is not reachable here ({detail})",
              file=sys.stderr)
        return 1
    required, optional, problems = [], [], []
    for found in packages.find_all(carried, options.python_version):
        if found.wheel:
            (required if found.package.required else optional).append(found.package)
        elif found.package.required:
            problems.append(f"{found.package.spec}: {found.problem}")
        else:
            print(f"  left out: {found.package.spec}: {found.problem}")
    manifest, failed = packages.prepare(required, optional, options.python_version,
                                        limit_mib=options.carry_limit_mib)
    for item in manifest["wheels"]:
        print(f"  {item['wheel']} ({item['bytes'] / 2**20:.2f} MiB)")
    for item in manifest["left_to_the_machine"]:
        print(f"  left to the machine: {item['wheel']} ({item['bytes'] / 2**20:.1f} MiB; the GPU run names it if "
              "the machine lacks it)")
    print(f"wheelhouse: {packages.WHEELHOUSE.relative_to(plan.REPO)}: {len(manifest['wheels'])} wheels, "
          f"{manifest['bytes'] / 2**20:.1f} MiB; with the working tree "
          f"{(manifest['bytes'] + manifest['tree_bytes']) / 2**20:.1f} of {options.carry_limit_mib:g} MiB. Carry "
          "that folder with the copy sent to the GPU machine (it is ignored by git).")
    for problem in problems + failed:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems or failed else 0
