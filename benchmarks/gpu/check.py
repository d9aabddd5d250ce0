"""The GPU check: one prepared command for a CUDA machine that is lent for a short window.

    bash benchmarks/gpu/check.sh [OUT] [--bundle DIR]     # on the GPU machine: setup, capture, every part, summary
    bash benchmarks/gpu/check.sh --dry-run [OUT]          # here: the plan, the packages, the estimate (CI runs it)
    bash benchmarks/gpu/check.sh --prepare                # here: the wheelhouse for a GPU machine without a registry

On the GPU machine it runs, in order and each under its own timeout inside one time budget (default 480 s): the
environment (the machine's own torch when it is a CUDA build; else a CUDA torch from the registry), the install
(the wheelhouse, or the registry), `harness backends`, the references, then each part of benchmarks/gpu/plan.py as a
`harness run`, then the summary. A part that fails or runs out of time is recorded and the next one runs; the
summary is written whatever happened, and no process of the check is left running.

Exit codes: 0 every step that could run finished (failing cases are findings: they are in the summary); 1 a harness
error (a crash, a usage error of `harness run`, a part with no results.json, a part out of time); 2 a usage error of
this script; 3 this machine cannot run the check (no GPU, no CUDA torch and no registry, an install that failed).

Standard library only until the harness's environment exists: the GPU machine's Python may not even have diffusers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import packages  # noqa: E402  (this folder, after the path above)

RESERVE_S = 20.0  # kept back from the budget for the summary, the bundle and the sweep
GRACE_S = 20.0  # a step out of time gets SIGTERM, then this long to stop its own processes, then SIGKILL
STEP_CAPS = {"environment": 120.0, "setup": 300.0, "backends": 90.0, "capture": 150.0}
EXIT_OK, EXIT_HARNESS, EXIT_USAGE, EXIT_MACHINE = 0, 1, 2, 3
INSPECT = r"""
import json, platform, sys
info = {"python": sys.executable, "version": platform.python_version(), "pip": True}
try:
    import pip  # noqa: F401
except ImportError:
    info["pip"] = False
try:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda, available=torch.cuda.is_available())
    info["gpus"] = torch.cuda.device_count() if info["available"] else 0
    info["names"] = [torch.cuda.get_device_name(i) for i in range(info["gpus"])]
    info["memory_mib"] = [torch.cuda.get_device_properties(i).total_memory // 2**20 for i in range(info["gpus"])]
except Exception as error:
    info["torch_error"] = f"{type(error).__name__}: {error}"
print(json.dumps(info))
"""
VERIFY = r"""
import json, sys
import torch, diffusers, harness
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "diffusers": diffusers.__version__,
        "harness": harness.__file__, "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None}
for name in ("xformers", "kernels", "flash_attn", "sageattention"):
    try:
        module = __import__(name)
        info[name] = getattr(module, "__version__", "installed")
    except Exception as error:  # absent, or present and broken: said either way
        info[name] = None if isinstance(error, ModuleNotFoundError) else f"{type(error).__name__}: {error}"
print(json.dumps(info))
"""


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """Usage errors name the option and exit 2, as `harness` does."""

    def error(self, message: str):
        raise UsageError(message)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def build_parser() -> Parser:
    parser = Parser(prog="check.sh", description="The GPU check (benchmarks/gpu/README.md).")
    parser.add_argument("out", nargs="?", default=None,
                        help="folder for the summary and reports (default: benchmarks/gpu/<date>-<gpu>)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="plan here: no GPU, nothing installed or run")
    mode.add_argument("--prepare", action="store_true", help="download the wheelhouse for an offline GPU machine")
    parser.add_argument("--budget-s", type=seconds, default=None,
                        help="the time the whole check may take, in seconds (default 480: one 10-minute command "
                             "with room to spare)")
    parser.add_argument("--parts", default=None, help="only these parts of plan.py, comma-separated (a rerun)")
    parser.add_argument("--bundle", default=None, metavar="DIR",
                        help="also copy the summary, the log, each part's matrix.md and a tarball of the reports "
                             "into DIR (at most 8 files, for a folder that brings back only a few)")
    parser.add_argument("--python", default=os.environ.get("PYTHON") or "python3",
                        help="the Python whose torch the check uses (default: $PYTHON, else python3)")
    parser.add_argument("--work", default=None, help="scratch folder for installed packages (default: "
                        "$TMPDIR/harness-gpu-check); reused by a rerun")
    parser.add_argument("--gpus", type=int, default=1, help="dry run: the GPUs to plan for (default 1)")
    parser.add_argument("--with", dest="with_", action="append", default=[], metavar="PACKAGE",
                        help="one more package to install (and check on the registry), e.g. --with einops")
    parser.add_argument("--without", action="append", default=[], metavar="NAME",
                        help="leave an optional backend package out")
    parser.add_argument("--python-version", default=packages.GPU_PYTHON,
                        help=f"the GPU machine's Python, for the wheels (default {packages.GPU_PYTHON})")
    parser.add_argument("--offline", action="store_true", help="dry run: do not ask the registry")
    parser.add_argument("--carry-limit-mib", type=float, default=packages.CARRY_LIMIT_MIB,
                        help="what a copy sent to the GPU machine may carry in all (default %(default)s MiB)")
    parser.add_argument("--json", default=None, metavar="FILE", help="dry run: also write the plan as JSON")
    parser.add_argument("--rehearse-on-cpu", action="store_true",
                        help="run the GPU path on a CPU machine (gloo), to rehearse the check itself; no figure "
                             "it writes is a GPU figure")
    return parser


# --- steps ------------------------------------------------------------------------------------------------------------

@dataclass
class Step:
    """One step of the run, as the summary reports it."""

    name: str
    status: str = "not run"  # ok, findings, failed, timeout, skipped, not run
    rc: int | None = None
    seconds: float = 0.0
    timeout_s: float | None = None
    detail: str = ""
    log: str = ""
    harness_error: bool = False
    extra: dict = field(default_factory=dict)


class Check:
    def __init__(self, options):
        self.options = options
        self.started = time.monotonic()
        self.budget = options.budget_s or 480.0
        self.steps: list[Step] = []
        self.child: subprocess.Popen | None = None
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.out: Path | None = Path(options.out).resolve() if options.out else None
        self.work = Path(options.work or Path(os.environ.get("TMPDIR", "/tmp")) / "harness-gpu-check").resolve()
        self.log_lines: list[str] = []
        self.facts: dict = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "budget_s": self.budget}

    # -- narrative --
    def say(self, text: str) -> None:
        stamp = f"[{time.monotonic() - self.started:5.0f}s]"
        for line in text.splitlines() or [""]:
            self.log_lines.append(f"{stamp} {line}")
            print(f"{stamp} {line}", flush=True)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "check.log").write_text("\n".join(self.log_lines) + "\n")

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started) - RESERVE_S

    # -- processes --
    def run(self, step: Step, command: list[str], cap: float, log: Path | None = None, cwd: Path = REPO) -> str:
        """Run a command as a process group of its own, its output to `log`; stop it at its timeout. Returns its
        stdout when no log is given."""
        step.timeout_s = round(max(min(cap, self.left()), 1.0), 1)
        begin = time.monotonic()
        sink = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 - closed below
        try:
            try:
                self.child = subprocess.Popen(command, cwd=cwd, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                              text=True, start_new_session=True)
            except OSError as error:  # e.g. --python names no program
                step.rc, step.seconds = 127, 0.0
                return f"cannot start {command[0]}: {error}"
            try:
                output, _ = self.child.communicate(timeout=step.timeout_s)
                step.rc = self.child.returncode
            except subprocess.TimeoutExpired:
                step.status, step.rc = "timeout", 124
                step.detail = f"did not finish within its {step.timeout_s:.0f} s"
                self.stop_child()
                output = ""
        finally:
            self.child = None
            if log:
                sink.close()
        step.seconds = round(time.monotonic() - begin, 1)
        if log:
            step.log = str(log.relative_to(self.out)) if self.out and log.is_relative_to(self.out) else str(log)
        return output or ""

    def stop_child(self) -> None:
        """SIGTERM to the step's process group (harness run then stops its torchrun and ranks), SIGKILL after."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        for signum, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(child.pid, signum)
            except ProcessLookupError:
                return
            try:
                child.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def sweep(self) -> list[str]:
        """Kill, by pid, every process still running whose command line names this check's folders (a rank or a
        torchrun that outlived its step); returns what was killed."""
        marks = [str(path) + os.sep for path in (self.out, self.work) if path is not None]
        killed = []
        proc = Path("/proc")
        if not proc.is_dir():
            return killed
        spared = _ancestors()  # this process and the shells that started it may name the folders too
        for entry in proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) in spared:
                continue
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(mark in command for mark in marks):
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.append(f"{entry.name}: {command[:120]}")
                except OSError:
                    pass
        return killed

    # -- the steps --
    def environment(self) -> dict | None:
        """Which torch this machine has: decides the path (its own CUDA torch, or one from the registry)."""
        step = self.add("environment")
        output = self.run(step, [self.options.python, "-c", INSPECT], STEP_CAPS["environment"])
        info = _json_line(output)
        if info is None:
            return self.fail(step, f"{self.options.python} did not answer: {output.strip()[-300:] or 'no output'}",
                             machine=True)
        step.extra = info
        if info.get("available") and info.get("cuda"):
            path = "installed"
            step.detail = (f"{info['python']} {info['version']}: torch {info['torch']}, CUDA {info['cuda']}, "
                           f"{info['gpus']} GPU(s): {', '.join(info['names'])} -> path: the machine's own CUDA torch "
                           "(nothing downloaded for it)")
        elif self.options.rehearse_on_cpu and "torch" in info:
            path = "installed"
            step.detail = (f"{info['python']} {info['version']}: torch {info['torch']} on CPU -> rehearsal on CPU "
                           "(--rehearse-on-cpu): nothing this run writes is a GPU figure")
        else:
            have = f"torch {info['torch']} (CUDA {info.get('cuda')}, GPU visible: {info.get('available')})" \
                if "torch" in info else f"no torch ({info.get('torch_error')})"
            gpus = _nvidia_gpus()
            if not gpus:
                return self.fail(step, f"{info['python']}: {have}, and no NVIDIA GPU here (nvidia-smi -L lists "
                                       "none): this is the GPU check; on a CPU machine run `check.sh --dry-run`, or "
                                       "`--rehearse-on-cpu` to rehearse it", machine=True)
            online, why = packages.reachable(self.options.python, timeout=30) if info.get("pip") else (False, "no pip")
            if not online:
                return self.fail(step, f"{info['python']}: {have}, and the registry is not reachable ({why}): this "
                                       "machine cannot run the GPU check (give a Python with a CUDA torch: "
                                       "--python PATH)", machine=True)
            path = "registry"
            step.detail = f"{info['python']}: {have} -> path: {packages.TORCH} (CUDA build) from the registry"
        step.status = "ok"
        info["path"] = path
        self.facts["environment"] = info
        self.say(f"environment: {step.detail}")
        return info

    def setup(self, info: dict) -> bool:
        """Install what is missing into a folder of our own on PYTHONPATH (the machine's packages stay as they are),
        then import torch, diffusers and the harness from there to prove it."""
        step = self.add("setup")
        site = self.work / f"site-py{info['version'].rsplit('.', 1)[0]}"
        self.env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
        self.env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS where torch asks for it
        self.env.setdefault("NCCL_DEBUG", "WARN")
        online = info["path"] == "registry" or packages.reachable(self.options.python, timeout=20)[0]
        if not online:
            self.env.setdefault("HF_HUB_OFFLINE", "1")  # no network: a hub lookup fails at once instead of waiting
        manifest = packages.read_manifest()
        key = json.dumps([info.get("python"), info.get("torch"), manifest, online, str(REPO)], sort_keys=True)
        marker = site / ".ready"
        if marker.exists() and marker.read_text() == key:
            step.detail = f"reused {site} (same Python, torch and wheelhouse as the last run)"
        else:
            shutil.rmtree(site, ignore_errors=True)
            site.mkdir(parents=True)
            if not self.install(step, info, site, online, manifest):
                return False
            marker.write_text(key)
        verify = self.run(Step("verify"), [self.options.python, "-c", VERIFY], 120)
        found = _json_line(verify)
        if found is None or not found["harness"].startswith(str(REPO)):
            return bool(self.fail(step, f"the environment does not import: {verify.strip()[-600:]}", machine=True))
        step.status, step.extra = "ok", found
        self.facts["installed"] = found
        source = "the registry" + (" and the wheelhouse" if manifest else "") if online else "the wheelhouse"
        step.detail = (f"{step.detail + '; ' if step.detail else ''}from {source}: torch {found['torch']} "
                       f"(CUDA {found['cuda']}), diffusers {found['diffusers']}; backend packages: "
                       + ", ".join(f"{name} {value or 'absent'}" for name, value in found.items()
                                   if name in ("xformers", "kernels", "flash_attn", "sageattention")))
        self.say(f"setup: {step.detail}")
        return True

    def install(self, step: Step, info: dict, site: Path, online: bool, manifest: dict | None) -> bool:
        """pip resolves against what the machine's Python already has (its torch stays), or, on the registry path,
        against nothing (a CUDA torch and everything else come from the registry); the pins go into `site`."""
        import plan

        python, log = self.options.python, self.logs / "setup.log"
        step.log = str(log.relative_to(self.out))
        needs = project_requirements()
        if info["path"] == "registry":
            required, ignore = [packages.TORCH, *needs, *self.options.with_], True
        else:
            carried = plan.install_plan(False, manifest)["required"] if manifest else []
            required, ignore = [*(r for r in needs if _name(r) != "torch"), *carried, *self.options.with_], False
        pins, problem = packages.resolve(python, required, online, ignore, env=self.env, timeout=max(self.left(), 60))
        if problem is not None:
            hint = "" if online else (" (offline: the wheelhouse lacks it; run `check.sh --prepare --with NAME` where "
                                      "the registry answers, and carry benchmarks/gpu/wheelhouse)")
            return bool(self.fail(step, f"pip cannot resolve {', '.join(required)}: {problem}{hint}", machine=True))
        if pins:
            process = packages.install(python, pins, site, online, timeout=max(self.left(), 60))
            _append(log, process)
            if process.returncode != 0:
                return bool(self.fail(step, f"pip could not install {', '.join(pins)}: {packages.last_line(process)}",
                                      machine=True))
        optional = self.optional(online, manifest)
        notes = []
        for spec in optional:  # each on its own: one that does not install is noted and the check goes on
            extra, problem = packages.resolve(python, [spec], online, env=self.env, timeout=120)
            if problem is None and extra:
                process = packages.install(python, extra, site, online, timeout=120)
                _append(log, process)
                problem = None if process.returncode == 0 else packages.last_line(process)
            notes.append(f"{spec}: " + ("installed" if problem is None and extra else "present" if problem is None
                                        else f"not installed ({_short(problem, 160)})"))
        step.extra["installed"], step.extra["optional"] = pins, notes
        step.detail = f"pip installed {len(pins)} package(s) into {site}" + (f" ({', '.join(pins)})" if len(pins) < 8
                                                                              else "")
        if notes:
            step.detail += "; optional: " + "; ".join(notes)
        return True

    def optional(self, online: bool, manifest: dict | None) -> list[str]:
        """The backend packages to try: the wheelhouse's; with the registry and no wheelhouse, every package
        diffusers names for a backend (asked of diffusers, now installed)."""
        import plan

        if manifest is not None or not online:
            return plan.install_plan(False, manifest)["optional"] if manifest else []
        done = subprocess.run([self.options.python, str(HERE / "plan.py"), "install", "--online"], capture_output=True,
                              text=True, env=self.env, timeout=120, cwd=REPO)
        listed = _json_line(done.stdout)
        return listed["optional"] if listed else []

    def backends(self) -> None:
        """`harness backends` on this machine: which backends its probes find usable, and why not."""
        step = self.add("backends")
        self.run(step, [self.options.python, "-m", "harness", "backends"], STEP_CAPS["backends"],
                 self.out / "backends.txt")
        step.detail = _last_matching(self.out / "backends.txt", " backends usable on ")
        self.finish(step, step.rc == 0)

    def capture(self) -> None:
        """Each part planned on this machine and its references captured (capture.py), before any part runs."""
        step = self.add("capture")
        self.run(step, [self.options.python, str(HERE / "capture.py"), "--out", str(self.out), "--gpus",
                        str(self.gpus)], STEP_CAPS["capture"], self.logs / "capture.log")
        step.detail = _last_matching(self.logs / "capture.log", "references: ")
        self.finish(step, step.rc == 0)

    def part(self, row: dict) -> None:
        """One `harness run`. Exit 1 with a fresh results.json is a finding (failing cases); anything else that is
        not 0 is a harness error."""
        step = self.add(row["name"])
        step.extra = {"title": row["title"], "args": row["args"], "estimate": row.get("estimate")}
        report = self.out / row["name"]
        (report / "results.json").unlink(missing_ok=True)
        if self.left() < 30:
            step.status, step.detail = "skipped", f"no time left in the budget ({max(self.left(), 0):.0f} s)"
            self.say(f"{row['name']}: {step.detail}")
            return
        self.say(f"{row['name']}: harness run {' '.join(row['args'])}")
        self.run(step, [self.options.python, "-m", "harness", "run", *row["args"]], row["cap_s"],
                 self.logs / f"{row['name']}.log")
        wrote = (report / "results.json").exists()
        if step.status == "timeout":
            step.harness_error = True
            step.detail += "; results.partial.jsonl keeps the cases that finished"
        elif step.rc == 0 and wrote:
            step.status = "ok"
        elif step.rc == 1 and wrote:
            step.status, step.detail = "findings", "exit 1: failing cases (see the summary); not a harness error"
        else:
            step.status, step.harness_error = "failed", True
            reason = {1: "exit 1 without results.json (a crash: see its log)",
                      2: "exit 2: harness run refused its options (a usage error)"}.get(step.rc, f"exit {step.rc}")
            step.detail = f"{reason}; {_tail(self.out / step.log)}"
        self.say(f"{row['name']}: {step.status} in {step.seconds:.0f} s"
                 + (f" (estimate {row['estimate']['seconds']:.0f} s)" if row.get("estimate") else "")
                 + (f": {step.detail}" if step.detail else ""))

    # -- bookkeeping --
    def add(self, name: str) -> Step:
        step = Step(name)
        self.steps.append(step)
        return step

    def fail(self, step: Step, detail: str, machine: bool = False) -> None:
        step.status, step.detail, step.harness_error = "failed", detail, not machine
        step.extra["machine"] = machine
        self.say(f"{step.name}: FAILED: {detail}")
        return None

    def finish(self, step: Step, ok: bool) -> None:
        if step.status == "timeout":
            step.harness_error = True
        elif ok:
            step.status = "ok"
        else:
            step.status, step.harness_error = "failed", True
            step.detail = f"exit {step.rc}; {_tail(self.out / step.log)}"
        self.say(f"{step.name}: {step.status} in {step.seconds:.0f} s" + (f": {step.detail}" if step.detail else ""))

    @property
    def logs(self) -> Path:
        path = self.out / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- the whole run --
    def main(self) -> int:
        self.say(f"GPU check: budget {self.budget:.0f} s; scratch {self.work}")
        info = self.environment()
        if info is None:
            return self.close(EXIT_MACHINE)
        self.gpus = max(int(info.get("gpus") or 0), 1)
        if self.out is None:
            name = re.sub(r"[^a-z0-9]+", "-", (info.get("names") or ["cpu"])[0].lower()).strip("-")
            self.out = REPO / "benchmarks" / "gpu" / f"{datetime.date.today()}-{name}x{info.get('gpus') or 0}"
            self.say(f"output: {self.out}")
        began = time.monotonic()
        ready = self.setup(info)
        self.steps[-1].seconds = round(time.monotonic() - began, 1)
        if not ready:
            return self.close(EXIT_MACHINE)
        self.backends()
        self.capture()
        rows = self.part_rows()
        if rows is None:
            return self.close(EXIT_HARNESS)
        for row in rows:
            self.part(row)
        return self.close(EXIT_HARNESS if any(step.harness_error for step in self.steps) else EXIT_OK)

    def part_rows(self) -> list[dict] | None:
        """The parts as capture.py planned them here (with their estimates); without its plan.json, as plan.py
        lists them."""
        try:
            rows = json.loads((self.out / "plan.json").read_text())
        except (OSError, ValueError):
            step = self.add("parts")
            output = self.run(step, [self.options.python, str(HERE / "plan.py"), "parts", "--out", str(self.out),
                                     "--gpus", str(self.gpus)], 120)
            rows = _json_line(output)
            if rows is None:
                self.fail(step, f"plan.py did not list the parts: {output.strip()[-600:]}")
                return None
            step.status = "ok"
        wanted = self.options.parts.split(",") if self.options.parts else None
        return [row for row in rows if wanted is None or row["name"] in wanted]

    def close(self, code: int) -> int:
        """The summary (always), the bundle, and the sweep for left-over processes."""
        if self.out is None:
            self.out = REPO / "benchmarks" / "gpu" / f"{datetime.date.today()}-unknown"
        killed = self.sweep()
        self.facts.update(wall_s=round(time.monotonic() - self.started, 1), exit_code=code,
                          left_over_processes=killed)
        self.say(f"left-over processes: {len(killed)} killed" + (f": {'; '.join(killed)}" if killed else " (none)"))
        import summary

        try:
            written = summary.write(self.out, [asdict(step) for step in self.steps], self.facts)
            self.say(f"summary: {written}")
        except Exception as error:  # noqa: BLE001 - the summary must not hide the run's own exit code
            self.say(f"summary: could not be written: {type(error).__name__}: {error}")
            code = code or EXIT_HARNESS
        if self.options.bundle:
            self.say(f"bundle: {', '.join(bundle(self.out, Path(self.options.bundle), [s.name for s in self.steps]))}")
        self.say(f"GPU check: exit {code} after {time.monotonic() - self.started:.0f} s")
        return code


def _nvidia_gpus() -> list[str]:
    """The GPUs the driver lists, whatever torch can see (a CPU build of torch sees none)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in listed.stdout.splitlines() if line.startswith("GPU ")] if listed.returncode == 0 else []


def _ancestors() -> set[int]:
    """This process and its parents up to init, read from /proc."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def bundle(out: Path, folder: Path, names: list[str]) -> list[str]:
    """At most 8 files into `folder`: the summary, the log, each part's matrix.md, and a tarball of the rest."""
    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    for source, name in [(out / "summary.md", "summary.md"), (out / "summary.json", "summary.json"),
                         (out / "check.log", "check.log"), (out / "backends.txt", "backends.txt"),
                         *((out / part / "matrix.md", f"{part}-matrix.md") for part in names)]:
        if source.exists() and len(copied) < 7:
            shutil.copyfile(source, folder / name)
            copied.append(name)
    with tarfile.open(folder / "reports.tar.gz", "w:gz") as tar:  # not the references, nor the launches' files
        tar.add(out, arcname=out.name,
                filter=lambda item: None if {"references", "work"} & set(item.name.split("/")[1:]) else item)
    copied.append("reports.tar.gz")
    return copied


def project_requirements() -> list[str]:
    """The harness's own requirements (pyproject.toml), as `pip install -e .` would install them."""
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_line(output: str):
    for line in reversed(output.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _append(log: Path, process: subprocess.CompletedProcess) -> None:
    with open(log, "a") as handle:
        handle.write(f"$ {' '.join(process.args)}\n{process.stdout}{process.stderr}\n(exit {process.returncode})\n")


def _last_matching(path: Path, text: str) -> str:
    try:
        return next((line.strip() for line in reversed(path.read_text(errors="replace").splitlines())
                     if text in line), "")
    except OSError:
        return ""


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return " | ".join(text[-lines:])[-400:] or "empty log"


def main(argv: list[str] | None = None) -> int:
    try:
        options = build_parser().parse_args(argv)
    except UsageError as error:
        print(f"check.sh: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if options.gpus < 1:
        print("check.sh: error: --gpus: give at least 1", file=sys.stderr)
        return EXIT_USAGE
    import plan

    unknown = sorted(set((options.parts or "").split(",")) - set(plan.PART_NAMES) - {""})
    if unknown:
        print(f"check.sh: error: --parts: unknown part(s) {', '.join(unknown)}; the parts: "
              f"{', '.join(plan.PART_NAMES)}", file=sys.stderr)
        return EXIT_USAGE
    if options.dry_run or options.prepare:
        os.chdir(REPO)  # the harness reads [tool.harness] from here, as on the GPU machine
        import dryrun

        options.out = options.out or str(REPO / "benchmarks" / "gpu" / f"{datetime.date.today()}-gpu")
        options.budget_s = options.budget_s or 480.0
        return dryrun.prepare(options) if options.prepare else dryrun.dry_run(options)
    check = Check(options)

    def terminated(signum, _frame):  # the machine's own limit: stop the step in flight, still write the summary
        check.say(f"signal {signum}: stopping")
        check.stop_child()
        raise SystemExit(check.close(EXIT_HARNESS))

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    return check.main()


if __name__ == "__main__":
    raise SystemExit(main())
