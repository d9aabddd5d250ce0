"""What one launch's start-up is made of, and what starting ranks another way would save: N ranks that import what
a harness rank imports (torch, diffusers, harness.engine.worker), join a gloo process group and meet at a barrier,
started three ways:

- `torchrun`: as the harness starts them today (`python -m torch.distributed.run --standalone`);
- `direct`: one interpreter per rank started by this process with torchrun's environment, no torchrun (what
  torchrun's own interpreter costs);
- `fork`: forked from a parent that has imported them already (what a fork server would pay per launch; the
  parent's own import, paid once per session, is printed apart).

Usage: `python benchmarks/bench_startup.py [--ranks 1,2,4] [--repeat 2]`. Wall seconds on whatever else the machine
runs: say so beside the figures (docs/measured.md, "The test command").
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

RANK_BODY = "--rank"  # argv of a rank started by torchrun or `direct`


def rank_body() -> None:
    """One rank: the imports, the process group, a barrier (every rank up), as a harness rank's start-up does."""
    import diffusers  # noqa: F401 - what a rank imports before its first case
    import torch.distributed as dist

    import harness.engine.worker  # noqa: F401

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_env(rank: int, ranks: int, port: int) -> dict:
    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
            "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def by_torchrun(ranks: int) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                    __file__, RANK_BODY], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def direct(ranks: int) -> float:
    started, port = time.perf_counter(), free_port()
    processes = [subprocess.Popen([sys.executable, __file__, RANK_BODY], env=rank_env(rank, ranks, port))
                 for rank in range(ranks)]
    if any(process.wait() for process in processes):
        raise SystemExit("a directly started rank failed")
    return time.perf_counter() - started


def forked(ranks: int) -> float:
    """Children of this process, which imported everything already (main); each runs the rank's body and exits."""
    started, port = time.perf_counter(), free_port()
    children = []
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            os.environ.update(rank_env(rank, ranks, port))
            rank_body()
            os._exit(0)
        children.append(pid)
    if any(os.waitpid(pid, 0)[1] for pid in children):
        raise SystemExit("a forked rank failed")
    return time.perf_counter() - started


def cell(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):.1f} s ({', '.join(f'{each:.1f}' for each in seconds)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=2)
    known = parser.parse_args()
    started = time.perf_counter()
    import diffusers  # noqa: F401 - the fork parent's one-time import

    import harness.engine.worker  # noqa: F401
    print(f"fork parent's own import of torch, diffusers and the worker (once per session): "
          f"{time.perf_counter() - started:.1f} s\n")
    print("| ranks | torchrun | direct (no torchrun) | fork from a warm parent |\n|---:|---:|---:|---:|")
    for ranks in map(int, known.ranks.split(",")):
        walls = {way: [] for way in (by_torchrun, direct, forked)}
        for _ in range(known.repeat):  # interleaved, so the machine's other load falls on each way alike
            for way, seconds in walls.items():
                seconds.append(way(ranks))
        print(f"| {ranks} | " + " | ".join(map(cell, walls.values())) + " |")


if __name__ == "__main__":
    rank_body() if sys.argv[1:] == [RANK_BODY] else main()
