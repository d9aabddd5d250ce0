"""What the GPU check runs, planned by the harness itself: each part is a `harness run` command line, and its plan is
what `harness run` builds from that line (the harness's own parser, `load_settings` and `plan_from`), so the dry run
on a CPU machine plans exactly the cases the GPU run runs. Which of them will run there depends on the device (a
CUDA backend's probe, the GPU count): that part is a prediction, made here from the harness's and diffusers' own
facts and said to be one. The time estimate is built from figures measured on CPU and stated GPU assumptions.

    python benchmarks/gpu/plan.py parts --out DIR --gpus N      # the parts' command lines, as JSON (the GPU run)
    python benchmarks/gpu/plan.py install --online|--offline    # what to pip install there, as JSON
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # this folder's modules, and the harness of this checkout

import packages  # noqa: E402  (after the path above)

REPO = packages.REPO
BUDGET_S = 480.0  # one command on a lent GPU machine may run 10 minutes; the check keeps 8 and leaves the rest
CASE_TIMEOUT_S = 60  # a tiny-zoo case takes about a second; on CUDA only this bound catches a spinning NCCL hang
LOW_PRECISION = ("bf16", "fp16")  # the single part: every backend against native SDPA, in the dtypes with a budget


@dataclass(frozen=True)
class Part:
    """One `harness run` of the check: its name (also its report folder), what it checks, the most of the budget it
    may take, and its own options (the references, report folder and case timeout are added for every part)."""

    name: str
    title: str
    cap_s: float
    options: tuple[str, ...]


PART_NAMES = ("single", "quick", "compile")  # in the order they run; `check.sh --parts` takes these


def parts(gpus: int) -> list[Part]:
    """The check's runs. Read from the harness, never copied: the backends diffusers registers, the quick plan's
    models and train models (harness.run.settings.preset) plus every model with a tiny pipeline, the quick plan as
    is."""
    from harness.catalogue.pipelines import MODELS as PIPELINES
    from harness.rank.backends import all_backend_names
    from harness.run.settings import OPTIONS, preset

    models = list(dict.fromkeys([*OPTIONS["models"].default, *PIPELINES]))  # one image case per pipeline
    single = ("--layouts", "single", "--backends", ",".join(all_backend_names()), "--dtypes", ",".join(LOW_PRECISION),
              "--kinds", "tensor,train,image", "--models", ",".join(models),
              "--train-models", ",".join(preset("quick")["train_models"]), "--allow-no-parallel")
    quick = ("--allow-no-parallel",) if gpus < 2 else ()  # on one GPU every parallel layout is a SKIP by capacity
    # Compiling costs far more than running: the quick plan's compile slice is a part of its own, last, so that a
    # budget it overruns cuts it short (its finished cases kept) and not the eager parts
    return [
        Part("single", "one GPU: the single layout, every attention backend against native SDPA in bf16 and fp16 "
                       "(tensor, train, one image case per pipeline), eager", 240.0, (*single, "--modes", "eager")),
        Part("quick", "the quick plan's layouts (NCCL), eager, as `harness run` runs them by default", 360.0,
             (*quick, "--modes", "eager")),
        Part("compile", "the quick plan's compile slice under Inductor (Triton kernels on CUDA), as `harness run` "
                        "compiles it by default; its eager twins are the quick part's", 300.0,
             (*quick, "--modes", "compile")),
    ]


def part_args(part: Part, out: Path) -> list[str]:
    return [*part.options, "--references", str(out / "references"), "--report-dir", str(out / part.name),
            "--case-timeout", str(CASE_TIMEOUT_S)]


def harness_plan(args: list[str]):
    """The plan `harness run ARGS` builds: its own parser, settings and planner (harness.cli.cmd_run)."""
    from harness.cli import build_parser
    from harness.run.runner import plan_from
    from harness.run.settings import OPTIONS, load_settings

    parsed = build_parser().parse_args(["run", *args])
    overrides = {name: getattr(parsed, name) for name in OPTIONS if hasattr(parsed, name)}
    settings = load_settings(overrides, start=REPO)
    return settings, plan_from(settings)


# --- what the GPU machine installs, from diffusers' own requirement messages ------------------------------------------

_REQUIREMENT = re.compile(r"`(?:pip install (?:-U )?)?([A-Za-z][\w.\-]*)\s*((?:[<>=!~]=?)[\w.*]+)?`")


def backend_requirements() -> dict[str, tuple[str, str] | str | None]:
    """backend -> None when nothing needs installing (PyTorch's own), (package, version spec) as diffusers' own
    message names it, or the message when it names nothing pip can install (FA3: "build ... from source")."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    from harness.rank.backends import all_backend_names

    found: dict[str, tuple[str, str] | str | None] = {}
    for name in all_backend_names():
        try:
            _check_attention_backend_requirements(AttentionBackendName(name))
            found[name] = None
        except RuntimeError as error:
            match = _REQUIREMENT.search(str(error))
            found[name] = (match[1], match[2] or "") if match and match[1] != "torch" else str(error)
    return found


def package_list(extra: list[str] = (), without: list[str] = ()) -> list[packages.Package]:
    """Everything the GPU run may install: torch (only without a CUDA torch there), diffusers at the version this
    checkout is tested with, each backend package diffusers names, and `extra` (`--with`)."""
    from importlib.metadata import version

    diffusers = version("diffusers")
    wanted = [
        packages.Package("torch", packages.TORCH, "the registry's CUDA build (never carried: gigabytes)",
                         carried=False),
        packages.Package("diffusers", f"diffusers=={diffusers}", "the library under test, the version this checkout "
                         "is tested with; carried with its dependencies of at most "
                         f"{packages.DEPENDENCY_MIB:g} MiB a wheel"),
    ]
    by_package: dict[tuple[str, str], list[str]] = {}
    for backend, need in backend_requirements().items():
        if isinstance(need, tuple) and need[0] not in packages.NOT_CUDA:
            by_package.setdefault(need, []).append(backend)
    for (name, spec), backends in by_package.items():
        if name in without:
            continue
        network = packages.NEEDS_NETWORK.get(name)
        why = f"backends {', '.join(backends)}" + (f"; {network}" if network else "")
        wanted.append(packages.Package(name, name + spec, why, required=False, carried=network is None,
                                       backends=tuple(backends)))
    for spec in extra:
        name = re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0]
        wanted.append(packages.Package(name, spec, "asked for with --with"))
    return wanted


def install_plan(online: bool, manifest: dict | None) -> dict:
    """What the GPU run pip-installs, in order: `required` in one call, then each optional package on its own (one
    that does not install is noted and the check goes on). Offline: what the wheelhouse holds."""
    if not online:
        if manifest is None:
            return {"required": [], "optional": [], "note": "no wheelhouse (run `check.sh --prepare` where the "
                                                            "registry answers, and carry benchmarks/gpu/wheelhouse)"}
        chosen = manifest["packages"]
        return {"required": [p["spec"] for p in chosen if p["required"]],
                "optional": [p["spec"] for p in chosen if not p["required"]]}
    every = [p for p in package_list() if p.name != "torch"]
    return {"required": [p.spec for p in every if p.required], "optional": [p.spec for p in every if not p.required]}


# --- which planned cases will run on the GPU (a prediction) -----------------------------------------------------------

@dataclass
class GpuView:
    """A planned case as the GPU run is expected to decide it: run, SKIP or ERROR, and why."""

    status: str
    reason: str = ""


def usable_on_gpu(found: dict[str, packages.Found], online: bool) -> dict[str, str]:
    """backend -> why it is expected to run on a CUDA GPU: PyTorch's own backends, and those whose package the GPU
    run installs (a wheel exists for it; a package that needs the network only on the registry path)."""
    usable = {}
    for backend, need in backend_requirements().items():
        if need is None:
            usable[backend] = "PyTorch's own"
        elif isinstance(need, tuple):
            hit = found.get(need[0])
            if hit is not None and hit.wheel and (online or hit.package.carried):
                usable[backend] = f"{hit.wheel} installed"
    return usable


def dtype_refusal(backend: str, dtype: str) -> str | None:
    """diffusers' own dtype constraint on a backend (checked by diffusers only under DIFFUSERS_ATTN_CHECKS, so on CPU
    a kernel that takes fp32 runs anyway, while CUDA's flash and cuDNN kernels do not)."""
    import torch
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    from harness.core.dtypes import torch_dtype

    query = torch.zeros(1, 8, 2, 16, dtype=torch_dtype(dtype))
    for check in _AttentionBackendRegistry._constraints.get(AttentionBackendName(backend), []):
        if "dtype" in check.__name__:
            try:
                check(query=query, key=query, value=query)
            except (ValueError, RuntimeError) as error:
                return f"{check.__name__}: {error}"
    return None


def gpu_view(planned, settings, gpus: int, usable: dict[str, str]) -> GpuView:
    """How the GPU run is expected to decide a case the CPU plan decided: device-independent reasons stay; a backend
    probe or backward that fails only for want of CUDA, or of a package the GPU run installs, is re-decided."""
    from harness.core.backend_names import EVERY_DEVICE
    from harness.rank import backends
    from harness.run.launchers import Capacity
    from harness.run.plan import expected_refusal, skip_reason

    case = planned.case
    if planned.plan_error is not None:
        return GpuView("ERROR", planned.plan_error)
    if case.backend == "-":  # a "not covered" row
        return GpuView("SKIP", planned.skip_reason or "")
    reason = planned.skip_reason
    if case.world_size > gpus or (reason and reason.startswith(f"needs {case.world_size} ranks")):
        reason = skip_reason(case, Capacity(gpus, 1, "GPUs"))
    if reason is not None:
        probed = backends.probe(case.backend, case.dtype).reason
        device_bound = reason == probed or reason.startswith(f"{case.backend} attention has no backward here (cpu")
        if device_bound and case.backend not in usable:  # there its probe says why: the package, not the CPU
            return GpuView("SKIP", probed or reason)
        if not device_bound:
            return GpuView("SKIP", reason)
        refusal = expected_refusal(case)
        if refusal is not None and not settings.check_refusals:
            return GpuView("SKIP", refusal.reason)
    refused = dtype_refusal(case.backend, case.dtype)
    if refused is not None:
        if case.backend in EVERY_DEVICE:  # harness/core/backend_names.py: a failing probe there is a broken backend
            return GpuView("ERROR", f"expected on CUDA: diffusers declares {case.backend} {refused}; the harness "
                                    "counts a failing probe of an every-device backend as an ERROR")
        return GpuView("SKIP", f"expected on CUDA: {refused}")
    return GpuView("RUN")


# --- the time estimate ------------------------------------------------------------------------------------------------

# Mean seconds of one case by kind and ranks, measured on the 2-core CPU machine at a load of about 6 (other work
# beside it, as usual there) in a rehearsal of this check (`--rehearse-on-cpu`): the single part for one rank, the
# quick plan for two. That quick plan took 188 s, 1.6x the quiet machine's 116 s (README, "Speed"); at a load of 12
# the same cases took up to 3x these. The tiny zoo is bound by Python and kernel launches, not arithmetic, so a GPU is
# not expected to beat a CPU per case. Four ranks on two cores share them, while on a GPU machine every rank has a GPU
# and cores of its own, so a wider case costs the two-rank figure times RANK_GROWTH per doubling (assumed: more
# collectives, more ranks to wait for).
CASE_S = {"tensor": {1: 0.18, 2: 0.19}, "image": {1: 0.44, 2: 0.44}, "train": {1: 0.10, 2: 0.56}}
RANK_GROWTH = 1.25
PLAN_S = 8.0  # `harness run` up to its first launch: imports and the plan (7.5 s for the single part here)
CUDA_INIT_S = 5.0  # first CUDA use in a process: context, cuBLAS and cuDNN handles (assumed)
NCCL_INIT_S = 5.0  # an NCCL communicator, once per launch of more than one rank (assumed)
FIRST_CALL_S = 1.0  # first call of a backend in a dtype within a launch: cuDNN graph build, kernel load (assumed)
# compiling one case with Inductor, its cache cold (assumed: the quick slice compiled in 173 s for 9 cases, about
# 19 s a case, on the 2-core CPU, docs/compile.md; Triton code generation taken as twice that, a train case twice
# again for its backward)
COMPILE_S = {"tensor": 40.0, "image": 40.0, "train": 80.0}
REPORTS_S = 3.0  # matrix, results.json and index.html of one part (under 1 s here)
SETUP_S = {"installed": 45.0, "registry": 240.0}  # venv-free pip into a folder + import check / + CUDA wheels (~3 GB)
BACKENDS_S = 20.0  # `harness backends`: imports and one probe per backend and dtype
CAPTURE_S = (5.0, 1.2)  # imports, then per reference (measured here: 12 references in 16.5 s on 2 cores)
SUMMARY_S = 5.0  # the summary, the bundle and the sweep for left-over processes
ASSUMPTIONS = [
    "a case costs the mean measured for its kind on one or two ranks on the 2-core CPU machine at a load of about 6 "
    "(CASE_S in benchmarks/gpu/plan.py; 1.6x the quiet machine, up to 3x less than at a load of 12); the tiny zoo "
    "is bound by Python and kernel launches, not by arithmetic, so a GPU is not expected to be faster per case",
    f"a wider case costs the two-rank figure x {RANK_GROWTH} per doubling of the ranks (assumed: on a GPU machine "
    "every rank has a GPU and cores of its own, where 4 ranks on 2 CPU cores share them)",
    f"each launch: 8 s start-up (harness/run/shards.py, measured here) + {CUDA_INIT_S:.0f} s first CUDA use + "
    f"{NCCL_INIT_S:.0f} s NCCL init when it has more than one rank (assumed)",
    f"{FIRST_CALL_S:.0f} s for the first call of each backend and dtype in a launch (cuDNN graphs, kernel loading; "
    "assumed); torch.compile only in the compile part (flex attention runs eagerly elsewhere)",
    f"a compiled case: {COMPILE_S['tensor']:.0f} s of Inductor with its cache cold ({COMPILE_S['train']:.0f} s a "
    "train case; assumed: twice the 19 s a case the quick slice took on the 2-core CPU)",
    f"setup {SETUP_S['installed']:.0f} s with the machine's own CUDA torch and the wheelhouse; "
    f"{SETUP_S['registry']:.0f} s where a CUDA torch must come from the registry",
    f"references: {CAPTURE_S[0]:.0f} s + {CAPTURE_S[1]} s each (measured here); the harness captures on the CPU",
]


def case_s(kind: str, ranks: int) -> float:
    measured = CASE_S.get(kind, CASE_S["tensor"])
    if ranks <= 2:
        return measured[max(ranks, 1)]
    return measured[2] * RANK_GROWTH ** math.log2(ranks / 2)


def part_estimate(views: list[tuple], gpus: int) -> dict:
    """Seconds of one part from the cases expected to run: (PlannedCase, GpuView) pairs."""
    from harness.run.shards import STARTUP_S  # one torchrun launch: imports, init and rendezvous

    running = [planned for planned, view in views if view.status == "RUN"]
    sizes = sorted({planned.case.world_size for planned in running})
    launches = sum(STARTUP_S + CUDA_INIT_S + (NCCL_INIT_S if size > 1 else 0.0) for size in sizes)
    cases = sum(case_s(p.case.kind, p.case.world_size) for p in running)
    compiling = sum(COMPILE_S.get(p.case.kind, COMPILE_S["tensor"]) for p in running if p.case.mode != "eager")
    first = FIRST_CALL_S * len({(p.case.world_size, p.case.backend, p.case.dtype) for p in running})
    total = PLAN_S + CUDA_INIT_S + launches + cases + compiling + first + REPORTS_S
    return {"seconds": round(total, 1), "cases_s": round(cases, 1), "compile_s": round(compiling, 1),
            "launches": len(sizes), "launches_s": round(launches, 1), "first_calls_s": round(first, 1),
            "runs": len(running)}


@dataclass
class PlannedPart:
    """A part with the harness's plan of its command line and each case's view from the GPU."""

    part: Part
    args: list[str]
    settings: object
    case_ids: list[str]
    views: list[tuple] = field(default_factory=list)
    estimate: dict = field(default_factory=dict)

    def counts(self) -> Counter:
        return Counter(view.status for _, view in self.views)


def own_view(planned) -> GpuView:
    """On a CUDA machine the plan is the GPU's own: its probes and GPU count decided it."""
    if planned.plan_error is not None:
        return GpuView("ERROR", planned.plan_error)
    return GpuView("RUN") if planned.runs else GpuView("SKIP", planned.skip_reason or "")


def plan_parts(out: Path, gpus: int, usable: dict[str, str] | None) -> list[PlannedPart]:
    """Each part's plan and its view from the GPU: predicted from `usable` (the dry run), or, with None, the plan
    of this CUDA machine as it stands."""
    planned_parts = []
    for part in parts(gpus):
        args = part_args(part, out)
        settings, plan = harness_plan(args)
        views = [(planned, own_view(planned) if usable is None else gpu_view(planned, settings, gpus, usable))
                 for planned in plan]
        planned_parts.append(PlannedPart(part, args, settings, [p.case.case_id for p in plan], views,
                                         part_estimate(views, gpus)))
    return planned_parts


def references_needed(planned_parts: list[PlannedPart]) -> list[tuple[str, str, str]]:
    return sorted({(p.case.kind, p.case.model, p.case.shape) for part in planned_parts for p, view in part.views
                   if view.status == "RUN"})


def estimate(planned_parts: list[PlannedPart], path: str = "installed") -> dict:
    references = len(references_needed(planned_parts))
    items = [("setup", SETUP_S[path]), ("backends", BACKENDS_S),
             ("capture", CAPTURE_S[0] + CAPTURE_S[1] * references),
             *((part.part.name, part.estimate["seconds"]) for part in planned_parts), ("summary", SUMMARY_S)]
    total = sum(seconds for _, seconds in items)
    return {"items": [{"step": name, "seconds": round(seconds, 1)} for name, seconds in items],
            "total_s": round(total, 1), "budget_s": BUDGET_S, "references": references}


def main(argv: list[str] | None = None) -> int:
    """The two questions the GPU run asks this module from inside its environment."""
    parser = argparse.ArgumentParser(prog="plan.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listed = commands.add_parser("parts", help="each part's `harness run` arguments, as JSON")
    listed.add_argument("--out", type=Path, required=True)
    listed.add_argument("--gpus", type=int, required=True)
    listed.add_argument("--estimate", action="store_true", help="with each part's estimate (plans every part)")
    install = commands.add_parser("install", help="what to pip install, as JSON")
    install.add_argument("--online", action=argparse.BooleanOptionalAction, required=True)
    args = parser.parse_args(argv)
    if args.command == "install":
        print(json.dumps(install_plan(args.online, packages.read_manifest())))
        return 0
    rows = []
    for part in parts(args.gpus):
        row = {"name": part.name, "title": part.title, "cap_s": part.cap_s, "args": part_args(part, args.out)}
        rows.append(row)
    if args.estimate:  # from this machine's own plan
        for row, planned in zip(rows, plan_parts(args.out, args.gpus, None), strict=True):
            row["estimate"] = planned.estimate
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
