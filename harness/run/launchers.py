"""How the ranks of a launch start: `local` (torchrun on this host, the default), `torchrun` (several nodes joined by
torchrun's c10d rendezvous; the same `harness run` runs on every node) or `slurm` (srun starts that same command on
every node of an allocation, or an sbatch script does).

Under `torchrun`, node 0 plans, launches, judges and writes the reports; nodes 1..N-1 run only their ranks
(harness.run.nodes). A group spreads over every node when its world size divides by the node count, and otherwise
runs on node 0 alone: `Capacity` says which, and what does not fit is a plan-time SKIP.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.records import NODE_ENV, RANK_THREADS

WORKER = ["-m", "harness.engine.worker"]
DEFAULT_PORT = 29500  # torchrun's own default rendezvous port
# Options that say how this run starts, not what it checks: rewritten when the run is handed to srun.
OWN_OPTIONS = ("launcher", "nnodes", "node_rank", "rdzv_endpoint", "slurm_script", "slurm_options")


@dataclass(frozen=True)
class Capacity:
    """How many ranks a group may have: `per_node` on each of `nnodes` nodes (`what` names the limit)."""

    per_node: int
    nnodes: int = 1
    what: str = "ranks allowed on CPU (cpu_max_ranks)"
    total: int | None = None  # a bound on all nodes together (on CPU, cpu_max_ranks stays the whole run's)

    def nodes_for(self, world_size: int) -> int | None:
        """Every node when the world size divides evenly over them and fits, else node 0 alone when it fits there,
        else None (the case is a SKIP)."""
        if self.total is not None and world_size > self.total:
            return None
        if self.nnodes > 1 and world_size % self.nnodes == 0 and world_size // self.nnodes <= self.per_node:
            return self.nnodes
        return 1 if world_size <= self.per_node else None

    def skip_reason(self, world_size: int) -> str | None:
        if self.nodes_for(world_size) is not None:
            return None
        if self.nnodes == 1 or self.total is not None:
            return f"needs {world_size} ranks; this machine has {self.total or self.per_node} {self.what}"
        return (f"needs {world_size} ranks; {self.nnodes} nodes x {self.per_node} {self.what} take a world size that "
                f"fits one node or divides evenly over the nodes")


def capacity(cpu_max_ranks: int, nnodes: int = 1, gpus_per_node: int = 0) -> Capacity:
    """On GPUs, nodes x devices per node (node 0's device count unless `gpus_per_node`); on CPU, cpu_max_ranks."""
    import torch

    if torch.cuda.is_available():
        return Capacity(gpus_per_node or torch.cuda.device_count(), nnodes, "GPUs" if nnodes == 1 else "GPUs each")
    return Capacity(cpu_max_ranks, nnodes, total=cpu_max_ranks)


@dataclass(frozen=True)
class Local:
    """torchrun on this host alone (`--standalone`): today's laptop and CI runner."""

    nnodes: int = 1
    node_rank: int = 0

    def command(self, world_size: int, nodes: int, group_file: Path, rdzv_id: str) -> list[str]:
        # torchrun checks its ranks every --monitor-interval and then stops the survivors; at its 0.1 s default it
        # can stop them before the launcher (every POLL_S) has seen which rank died first, and the wrong rank gets
        # blamed.
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
                "--monitor-interval=1", *WORKER, str(group_file)]

    def hand_off(self, forwarded: list[str]) -> list[str] | None:
        """The command that runs this `harness run` on every node instead of here, or None: this process runs it."""
        return None


@dataclass(frozen=True)
class Torchrun(Local):
    """One torchrun agent per node, joined by a c10d rendezvous at `endpoint`; every launch gets its own id."""

    endpoint: str = ""

    def command(self, world_size: int, nodes: int, group_file: Path, rdzv_id: str) -> list[str]:
        if nodes == 1:  # a group that runs on node 0 alone needs no rendezvous with the others
            return super().command(world_size, nodes, group_file, rdzv_id)
        return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                f"--nproc-per-node={world_size // nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.endpoint}",
                f"--rdzv-id={rdzv_id}", "--max-restarts=0", "--monitor-interval=1", *WORKER, str(group_file)]


@dataclass(frozen=True)
class Slurm(Torchrun):
    """srun starts `harness run --launcher torchrun` once per node; node 0 is the first node of the allocation."""

    gpus_per_node: int = 0
    options: tuple[str, ...] = ()

    def hand_off(self, forwarded: list[str]) -> list[str]:
        return ["srun", *self._allocation(), "--kill-on-bad-exit=1", "bash", "-c", self._per_node(forwarded)]

    def script(self, forwarded: list[str], workdir: Path) -> str:
        """An sbatch script that does what `hand_off` does, from `workdir`."""
        header = [f"#SBATCH {option}" for option in ("--job-name=harness", *self._allocation())]
        srun = shlex.join(["srun", "--kill-on-bad-exit=1", "bash", "-c", self._per_node(forwarded)])
        return "\n".join(["#!/bin/bash", *header,
                          "# written by `harness run --launcher slurm --slurm-script`: node 0 plans and judges, every",
                          "# node runs its share of the ranks; the report folder must be on a shared filesystem",
                          "set -euo pipefail", f"cd {shlex.quote(str(workdir))}", srun, ""])

    def _allocation(self) -> list[str]:
        gpus = [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []
        return [f"--nodes={self.nnodes}", "--ntasks-per-node=1", *gpus, *self.options]

    def _per_node(self, forwarded: list[str]) -> str:
        """One task per node: node 0's host name is the rendezvous address; SLURM_NODEID is the node's number."""
        endpoint = self.endpoint or f"$HEAD:{DEFAULT_PORT}"
        run = shlex.join([sys.executable, "-m", "harness", "run", *forwarded, "--launcher", "torchrun",
                          "--nnodes", str(self.nnodes)])
        return (f'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1); exec {run} '
                f'--node-rank "$SLURM_NODEID" --rdzv-endpoint "{endpoint}"')


LAUNCHERS = {"local": Local, "torchrun": Torchrun, "slurm": Slurm}  # the `launcher` option's values


def launcher_from(settings) -> Local:
    """The launcher the options ask for; a combination that cannot work is an error naming the option to fix."""
    name, nnodes, node_rank = settings.launcher, settings.nnodes, settings.node_rank
    if nnodes < 1:
        raise HarnessError(f"option nnodes: {nnodes} is not a node count; give --nnodes 1 or more")
    if name != "slurm" and (settings.slurm_script or settings.slurm_options):
        raise HarnessError("options slurm_script / slurm_options need --launcher slurm")
    if name == "local":
        if nnodes > 1 or node_rank:
            raise HarnessError(f"option launcher: --nnodes {nnodes} --node-rank {node_rank} need --launcher torchrun "
                               "(the same command on every node) or --launcher slurm")
        return Local()
    if name == "slurm":
        return Slurm(nnodes, 0, _endpoint(settings.rdzv_endpoint) if settings.rdzv_endpoint else "",
                     settings.gpus_per_node, tuple(settings.slurm_options))
    if not 0 <= node_rank < nnodes:
        raise HarnessError(f"option node_rank: {node_rank} is not a node of --nnodes {nnodes}; give 0..{nnodes - 1} "
                           "(0 on the node that plans and judges)")
    if nnodes > 1 and not settings.rdzv_endpoint:
        raise HarnessError(f"option rdzv_endpoint: --launcher torchrun with --nnodes {nnodes} needs --rdzv-endpoint "
                           "HOST:PORT, node 0's address as every node reaches it (e.g. node0.cluster:29500)")
    return Torchrun(nnodes, node_rank, _endpoint(settings.rdzv_endpoint) if nnodes > 1 else "")


def _endpoint(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise HarnessError(f"option rdzv_endpoint: {text!r} is not HOST:PORT (e.g. node0.cluster:{DEFAULT_PORT})")
    return text


def node_env(node_rank: int) -> dict[str, str]:
    """The environment of a node's torchrun and its ranks: one thread per rank (ranks share the node's cores, and
    torchrun prints a banner when OMP_NUM_THREADS is unset), quiet diffusers, and the node's number for the events."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", RANK_THREADS)
    env.setdefault("DIFFUSERS_VERBOSITY", "error")
    env["PYTHONWARNINGS"] = "ignore"
    env[NODE_ENV] = str(node_rank)
    return env
