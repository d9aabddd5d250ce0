"""The ranks' rare heap corruption on demand: rounds of `harness run` over the launches most often seen before a
rank died in native code (glibc's "malloc(): unaligned tcache chunk detected", docs/reliability.md), with glibc's
heap checks on, and every death kept with its Python stack and its core's backtrace.

A round is one `harness run` of the slice below, from the project root (its pyproject's plan, compile slice and
known issues): flux and qwenimage, `ulysses2`, `ring2` and `tp2`, the tensor kind with every flow of the quick plan,
eager cases and the compile slice's compiled ones on the same long-lived 2-rank group (259 cases in one launch),
the comms recorder on, the ranks forked from the run's warm parent, Inductor's cache cold (the round's own folder)
unless `--warm-cache`. Heap checks (`--checks`, on by default): glibc's malloc-check mode through its debug library
(`LD_PRELOAD=libc_malloc_debug.so.0`, `glibc.malloc.check=3`: a write past a chunk's end aborts at that chunk's
free, not cases later) and `glibc.malloc.perturb` (freed memory overwritten, so a late reader sees garbage). The
warm parent is started under them, so every rank forked from it has them.

`--off` switches suspects off, each alone or together: `recorder` (the comms recorder's dispatch mode), `async`
(functional collectives waited for as issued), `inductor` (the compiled cases run `aot_eager`: Dynamo and
AOTAutograd, no Inductor kernels), `fork` (ranks started by torchrun, not forked from the warm parent), and
`one_thread`, the workaround (each gloo group back to gloo's two worker threads); the patches are
benchmarks/heap_stress_site/sitecustomize.py's.

`--inject heap_overflow_rank1` is the positive control: one case whose rank 1 writes 8 bytes past a 40-byte heap
block (harness/faults/reliability.py). With the checks its rank must die at that block's free, be named with its
stack and core, and the case rerun once in a fresh group (where it dies again); without them nothing notices there.

Each death: the case, the rank's Python stack (its faulthandler's, the case's traceback), and, where the kernel
writes cores (`--cores`; as root the script points kernel.core_pattern there for the run and restores it), the
core's native backtrace (`gdb -batch`), all under `--out`/deaths/ (an attempt the harness reran counts too). One
line per round and a summary (rounds, launches, cases run, rank deaths, the CPU time of every process of the
rounds) go to stdout and `--out`/rounds.jsonl.

Usage: `nice -n 19 python benchmarks/heap_stress.py [--rounds 10] [--off recorder,async] [--no-checks]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(__file__).resolve().parent / "heap_stress_site"
SLICE = ["--models", "flux,qwenimage", "--layouts", "ulysses2,ring2,tp2", "--kinds", "tensor"]
# the positive control's one case (`--inject`): a fault in it must be found the way a real corruption would be
CONTROL = ["--models", "flux", "--layouts", "ulysses2", "--backends", "native", "--dtypes", "fp32", "--kinds",
           "tensor", "--modes", "eager", "--loads", "enable", "--flows", "none"]
CHECKS = {"LD_PRELOAD": "libc_malloc_debug.so.0", "GLIBC_TUNABLES": "glibc.malloc.check=3:glibc.malloc.perturb=165"}
CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
SUSPECTS = {"recorder", "async", "inductor", "fork", "one_thread"}
ROUND_TAG = "HEAP_STRESS_ROUND"  # in every process of a round, for CpuMeter
DIED = re.compile(r"rank (\d+) died during the case \(pid (\d+)\)")


def round_env(off: set[str], checks: bool) -> dict[str, str]:
    env = dict(os.environ)
    if checks:
        env.update(CHECKS)
    if off:
        env["HEAP_STRESS_OFF"] = ",".join(sorted(off))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH")]))
    return env


def round_args(report_dir: Path, off: set[str], warm_cache: Path | None, inject: str | None = None) -> list[str]:
    args = ["run", *(CONTROL if inject else SLICE), "--report-dir", str(report_dir), "--keep-work",
            "--case-timeout", "900"]
    if inject:
        args += ["--inject-fault", inject]
    if "inductor" in off:
        args += ["--modes", "eager,aot_eager"]
    if "fork" in off:
        args += ["--rank-start", "torchrun"]
    if warm_cache is not None:
        args += ["--compile-cache", str(warm_cache)]
    return args


def _unlimited_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def run_round(index: int, out: Path, off: set[str], checks: bool, warm_cache: Path | None,
              inject: str | None = None) -> dict:
    report_dir = out / f"round-{index}"
    started, tag = time.monotonic(), f"{os.getpid()}-{index}"
    with open(out / f"round-{index}.log", "w") as log, CpuMeter(tag) as meter:
        command = [sys.executable, "-m", "harness", *round_args(report_dir, off, warm_cache, inject)]
        done = subprocess.run(command, cwd=ROOT, env={**round_env(off, checks), ROUND_TAG: tag}, stdout=log,
                              stderr=subprocess.STDOUT, preexec_fn=_unlimited_cores)
    return {"round": index, "exit": done.returncode, "wall_s": round(time.monotonic() - started, 1),
            "cpu_s": round(meter.seconds(), 1), "pids": set(meter.seen), **tally(report_dir)}


class CpuMeter:
    """The CPU seconds of every process whose environment carries `tag` (the round's run, its warm parent, agents,
    ranks, compile workers and compilers), read from /proc every second: a rank's time is not its launcher's to
    collect (an agent stopped with SIGKILL never reaps it), and a process shorter than a second is missed."""

    def __init__(self, tag: str) -> None:
        self.needle, self.seen, self.stop = f"{ROUND_TAG}={tag}".encode(), {}, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuMeter:
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        self.thread.join()

    def seconds(self) -> float:
        return sum(self.seen.values()) / os.sysconf("SC_CLK_TCK")

    def _sample(self) -> None:
        while not self.stop.wait(1.0):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if self.needle in Path(f"/proc/{pid}/environ").read_bytes():
                        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                        self.seen[pid] = int(fields[11]) + int(fields[12])  # utime, stime
                except OSError:  # gone, or not ours to read
                    pass


def tally(report_dir: Path) -> dict:
    """What the round ran and lost: launches, cases run, statuses, and each rank death (case, rank, pid, reason)."""
    sys.path.insert(0, str(ROOT))
    from harness.core.results import read_results

    try:
        header, results = read_results(report_dir / "results.json")
    except Exception as error:  # noqa: BLE001 - a round that wrote no results is said, not fatal to the loop
        return {"launches": 0, "cases": 0, "statuses": {}, "deaths": [], "error": str(error)}
    statuses: dict[str, int] = {}
    deaths = []
    for result in results:
        statuses[result.status.value] = statuses.get(result.status.value, 0) + 1
        first = result.rank_death or {}  # an attempt a death ended, rerun in a fresh group (harness.run.launch)
        for reason, stack in ((first.get("error", ""), first.get("traceback", "")),
                              (result.reason, result.extra.get("traceback", ""))):
            found = DIED.search(reason)
            if found:
                deaths.append({"case": result.case_id, "rank": int(found[1]), "pid": int(found[2]),
                               "reason": reason, "stack": stack})
    return {"launches": header.launches, "cases": sum(r.status.ran for r in results), "statuses": statuses,
            "deaths": deaths}


def keep_deaths(record: dict, out: Path, cores: Path | None, keep_cores: bool = False) -> None:
    """Each death's stack, its core's backtrace and the round's launch logs under out/deaths/round-N/."""
    if not record["deaths"]:
        return
    kept = out / "deaths" / f"round-{record['round']}"
    kept.mkdir(parents=True, exist_ok=True)
    launches = out / f"round-{record['round']}.work" / "launches"
    for log in launches.glob("ws*/ranks.log"):
        shutil.copy(log, kept / f"{log.parent.name}-ranks.log")
    for number, death in enumerate(record["deaths"]):
        (kept / f"death-{number}.txt").write_text(f"{death['case']}\n{death['reason']}\n\n{death['stack']}\n")
        core = next(iter(sorted(cores.glob(f"core.*.{death['pid']}.*"))), None) if cores else None
        if core is not None:
            death["core"] = str(core)
            (kept / f"death-{number}.gdb.txt").write_text(backtrace(core))
            if not keep_cores:  # 0.4 to 2 GB each: the backtrace is what is kept
                core.unlink()


def other_cores(record: dict, out: Path, cores: Path | None) -> None:
    """Cores of the round's other processes (a compile worker, the launcher; not another program's that shares the
    folder): their backtraces kept, the cores removed (a rank's is 0.4 to 2 GB)."""
    if cores is None:
        return
    mine = {death.get("core") for death in record["deaths"]}
    for core in sorted(cores.glob("core.*")):
        if str(core) in mine or core.name.rsplit(".", 2)[-2] not in record["pids"]:  # core.<name>.<pid>.<time>
            continue
        kept = out / "deaths" / f"round-{record['round']}"
        kept.mkdir(parents=True, exist_ok=True)
        (kept / f"{core.name}.gdb.txt").write_text(backtrace(core))
        record.setdefault("other_cores", []).append(core.name)
        core.unlink()


def backtrace(core: Path) -> str:
    """Every thread's native stack from the core, and the crashing thread's Python frames where gdb can read them."""
    done = subprocess.run(["gdb", "-batch", "-iex", "set auto-load safe-path /", "-ex", "bt 60",
                           "-ex", "py-bt", "-ex", "thread apply all bt 25", os.path.realpath(sys.executable),
                           str(core)], capture_output=True, text=True, timeout=600)
    return done.stdout + done.stderr


def point_cores(cores: Path) -> str | None:
    """Point the kernel's core files at `cores` (root only); returns the pattern to restore, None if left alone."""
    cores.mkdir(parents=True, exist_ok=True)
    try:
        before = CORE_PATTERN.read_text().strip()
        CORE_PATTERN.write_text(f"{cores}/core.%e.%p.%t\n")
    except OSError:
        return None
    return before


def drop_round(out: Path, index: int, keep: bool) -> None:
    """A round's report and work folders are large (baselines, checkpoints, compile cache): kept only on a death."""
    if not keep:
        shutil.rmtree(out / f"round-{index}", ignore_errors=True)
        shutil.rmtree(out / f"round-{index}.work", ignore_errors=True)


def summary(records: list[dict], off: set[str], checks: bool) -> str:
    deaths = sum(len(r["deaths"]) for r in records)
    return (f"heap stress: {len(records)} round(s), {sum(r['launches'] for r in records)} launch(es), "
            f"{sum(r['cases'] for r in records)} case(s) run, {deaths} rank death(s), "
            f"{sum(r['cpu_s'] for r in records) / 3600:.1f} CPU hours; off: "
            f"{','.join(sorted(off)) or 'nothing'}; heap checks {'on' if checks else 'off'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--off", default="", help="suspects switched off: recorder, async, inductor, fork")
    parser.add_argument("--checks", action=argparse.BooleanOptionalAction, default=True, help="glibc's heap checks")
    parser.add_argument("--warm-cache", action="store_true", help="one Inductor cache for every round (else cold)")
    parser.add_argument("--inject", metavar="FAULT", help="the positive control: one case with this fault, e.g. "
                        "heap_overflow_rank1 (a rank overflows a heap block: with --checks it must die at its free)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/heap-stress"))
    parser.add_argument("--keep-cores", action="store_true", help="keep a death's core beside its backtrace")
    parser.add_argument("--cores", type=Path, default=Path("/tmp/heap-stress/cores"))
    args = parser.parse_args()
    off = {name for name in args.off.split(",") if name}
    if off - SUSPECTS:
        parser.error(f"--off: unknown suspect(s) {', '.join(sorted(off - SUSPECTS))}; of {', '.join(sorted(SUSPECTS))}")
    args.out.mkdir(parents=True, exist_ok=True)
    restore = point_cores(args.cores)
    cores = args.cores if restore is not None else None
    records = []
    try:
        for index in range(1, args.rounds + 1):
            record = run_round(index, args.out, off, args.checks, args.out / "compile-cache" if args.warm_cache
                               else None, args.inject)
            keep_deaths(record, args.out, cores, args.keep_cores)
            other_cores(record, args.out, cores)
            drop_round(args.out, index, keep=bool(record["deaths"]))
            record.update(off=sorted(off), checks=args.checks, inject=args.inject)
            with open(args.out / "rounds.jsonl", "a") as rounds:
                rounds.write(json.dumps({k: v for k, v in record.items() if k not in ("deaths", "pids")} |
                                        {"deaths": [{k: v for k, v in d.items() if k != "stack"}
                                                    for d in record["deaths"]]}) + "\n")
            records.append(record)
            print(f"round {index}: exit {record['exit']}, {record['wall_s']}s wall, {record['cpu_s']}s CPU, "
                  f"{record['launches']} launch(es), "
                  f"{record['cases']} case(s), statuses {record['statuses']}, "
                  f"{len(record['deaths'])} death(s) {[d['case'] for d in record['deaths']]}", flush=True)
    finally:
        if restore is not None:
            CORE_PATTERN.write_text(restore + "\n")
    print(summary(records, off, args.checks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
