"""How often a two-rank gloo script aborts as it exits, after its work is done, by how it ends: `teardown` (Python's
own, after `dist.barrier()` and `destroy_process_group()`) or `os_exit` (the same, then `os._exit(0)`, as the
harness's ranks, its test scripts and its repro scripts end). The script trains two FSDP2 linear layers three steps.

The abort ("terminate called without an active exception", SIGABRT) is a race: a gloo worker thread frees a finished
collective holding a Python object while the main thread finalizes the interpreter (docs/reliability.md). It shows
more with the machine busy, so the runs go several side by side (`--lanes`).

Usage: `python benchmarks/exit_abort.py [--runs 40] [--lanes 3] [--ends teardown,os_exit]`. Prints the aborts per
ending; a core dump of an aborted rank (`ulimit -c unlimited`) gives the stack.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SCRIPT = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 64)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.barrier()
dist.destroy_process_group()
"""
ENDS = {"teardown": "", "os_exit": "import os, sys; sys.stdout.flush(); sys.stderr.flush(); os._exit(0)\n"}


def one_run(script: Path) -> str:
    """'ok', 'abort' (a rank's SIGABRT at exit) or the first line of any other failure."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True)
    if done.returncode == 0:
        return "ok"
    if "terminate called without an active exception" in done.stderr:
        return "abort"
    return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per ending")
    parser.add_argument("--lanes", type=int, default=3, help="runs side by side")
    parser.add_argument("--ends", default=",".join(ENDS), help=f"comma-separated, of {', '.join(ENDS)}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for end in args.ends.split(","):
            script = Path(folder) / f"{end}.py"
            script.write_text(SCRIPT + ENDS[end])
            with ThreadPoolExecutor(args.lanes) as pool:
                outcomes = list(pool.map(one_run, [script] * args.runs))
            others = sorted({outcome for outcome in outcomes if outcome not in ("ok", "abort")})
            print(f"{end}: {outcomes.count('abort')} aborted at exit in {args.runs} runs ({args.lanes} side by side)"
                  + (f"; other failures: {others}" if others else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
