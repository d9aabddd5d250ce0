"""The ranks' heap corruption in a loop of a few lines: two ranks issue gloo's functional collectives (an all-to-all,
an all-gather and an all-reduce, as diffusers' Ulysses and ring attention and DTensor issue them) back to back,
without waiting between them, on tensors of 1 to 4096 elements, consume or drop the results, with the comms
recorder's dispatch mode on half the time, under glibc's heap checks (benchmarks/heap_stress.py's). Found on
2026-12-06: a rank aborts in glibc ("free(): invalid pointer" in a gloo worker thread's all-reduce, "malloc():
unaligned fastbin chunk detected" as the next all-reduce is queued), its heap's small blocks overwritten with a
float32 tensor's values (docs/findings.md).

Each switch takes one suspect away: `--sync` waits for every collective as it is issued (no two in flight),
`--no-drop` never drops an unwaited result, `--no-recorder` leaves the recorder off, `--one-thread` gives each gloo
group one worker thread instead of two (harness.rank.cpu's shim: collectives then run one after the other, in the
order issued). `--no-checks` runs without glibc's checks.

Usage: `nice -n 19 python benchmarks/gloo_concurrency.py [--runs 8] [--iterations 10000] [--one-thread] ...`.
Prints one line per run (its exit, glibc's message) and the deaths in all; each run's log is kept under --out, and a
dead rank's core where kernel.core_pattern says (core dumps are allowed for the ranks).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = "--rank-body"
GLIBC = re.compile(r"(free\(\): [a-z ]+|malloc\(\): [a-z ]+|malloc_consolidate\(\): [a-z ]+|double free[a-z ()]*|"
                   r"corrupted [a-z ()]+)")
SIZES = [1, 2, 3, 8, 17, 64, 130, 257, 1000, 4096]


def rank_body(iterations: int, sync: bool, drop: bool, record: bool, one_thread: bool) -> None:
    """One rank's loop; both ranks draw the same sizes and choices, so their collectives pair up."""
    sys.path.insert(0, str(HERE.parent))
    if one_thread:
        from harness.rank.cpu import _gloo_one_worker_thread

        _gloo_one_worker_thread()
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from harness.rank.recorder import RunRecorder

    if sync:
        funcol._maybe_wrap_tensor = funcol.wait_tensor
    dist.init_process_group("gloo")
    world, group, draw = dist.get_world_size(), dist.group.WORLD, random.Random(1234)
    module, kept = torch.nn.Linear(4, 4), []
    for step in range(iterations):
        n = draw.choice(SIZES)
        recorder = RunRecorder(module) if record and draw.random() < 0.5 else None
        if recorder is not None:
            recorder.__enter__()
        exchanged = funcol.all_to_all_single(torch.randn(world * n), None, None, group)
        gathered = funcol.all_gather_tensor(torch.randn(n), 0, group)
        summed = funcol.all_reduce(torch.randn(n), "sum", group)
        choice = draw.random()
        if choice < 0.3 and drop:
            del exchanged, gathered, summed  # dropped unwaited, as when an error ends a case between issue and use
        elif choice < 0.6:
            _ = (exchanged + 1).sum() + gathered.sum() + summed.sum()
        else:
            kept = [*kept[-4:], gathered]
            _ = exchanged.chunk(world)[0].sum() + summed.sum()
        small = [torch.empty(draw.randint(1, 300)) for _ in range(20)]  # small blocks come and go
        del small
        if draw.random() < 0.05:
            dist.all_gather_object([None] * world, {"step": step, "text": "x" * draw.randint(0, 500)})
        if recorder is not None:
            recorder.__exit__(None, None, None)
    dist.barrier()
    print(f"rank {dist.get_rank()}: {iterations} iterations", flush=True)
    os._exit(0)


def one_run(args, log: Path) -> tuple[int, str]:
    """(exit code, glibc's message or ''): one torchrun of two ranks."""
    flags = [flag for flag, on in (("--sync", args.sync), ("--no-drop", not args.drop),
                                   ("--no-recorder", not args.recorder), ("--one-thread", args.one_thread)) if on]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    if args.checks:
        env.update({"LD_PRELOAD": "libc_malloc_debug.so.0",
                    "GLIBC_TUNABLES": "glibc.malloc.check=3:glibc.malloc.perturb=165"})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
               RANK, str(args.iterations), *flags]
    with open(log, "w") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=1800,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
    said = GLIBC.search(log.read_text(errors="replace"))
    return done.returncode, said[0] if said else ""


def main() -> int:
    if sys.argv[1:2] == [RANK]:
        rest = sys.argv[3:]
        rank_body(int(sys.argv[2]), "--sync" in rest, "--no-drop" not in rest, "--no-recorder" not in rest,
                  "--one-thread" in rest)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=10000, help="per run")
    parser.add_argument("--sync", action="store_true", help="wait for each collective as it is issued")
    parser.add_argument("--drop", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--recorder", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--one-thread", action="store_true", help="one gloo worker thread per group")
    parser.add_argument("--checks", action=argparse.BooleanOptionalAction, default=True, help="glibc's heap checks")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gloo-concurrency"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deaths, started = 0, time.monotonic()
    for run in range(1, args.runs + 1):
        code, said = one_run(args, args.out / f"run{run}.log")
        deaths += code != 0
        print(f"run {run}: exit {code}{', ' + said if said else ''}", flush=True)
    print(f"gloo concurrency: {deaths} death(s) in {args.runs} run(s) of {args.iterations} iterations "
          f"({time.monotonic() - started:.0f}s); sync {args.sync}, drop {args.drop}, recorder {args.recorder}, "
          f"one thread {args.one_thread}, heap checks {args.checks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
