"""The torchrun entry point: every rank runs every case of its group; rank 0 measures and reports.

Events go to one JSON-lines file per rank, flushed per line, so the launcher sees progress, a rank's error,
and every finished case even if the group dies later.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from harness.core import determinism, events
from harness.core.errors import traceback_text
from harness.core.records import NODE_ENV, STACKS_SIGNAL, Case, CaseRecord, GroupSpec
from harness.engine import tracer as tracing
from harness.engine.baselines import Baselines, Prefetch
from harness.engine.casework import measure, run_case
from harness.engine.context import RankContext
from harness.engine.localization import localize_case
from harness.engine.tracer import Tracer
from harness.kinds import kind_of
from harness.rank import backends, cpu


class Worker:
    """One rank's loop over its group's cases and the events that tell the launcher what happened."""

    def __init__(self, group: GroupSpec, rank: int, world_size: int, tracer: Tracer | None = None):
        self.group, self.rank, self.world_size, self.tracer = group, rank, world_size, tracer
        local_rank = int(os.environ.get("LOCAL_RANK", rank))  # the device on this node, whatever the node
        device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}") if torch.cuda.is_available() \
            else torch.device("cpu")
        images = Path(group.images_dir) if group.images_dir else None
        self.work = RankContext(Path(group.references), images, device,
                                Path(group.checkpoints) if group.checkpoints else None)
        self.baselines = Baselines(self.work, Path(group.baselines) if group.baselines else None)
        # the ranks on rank 0's node compute baselines for it while it measures (over several nodes the others may
        # not see the shared folder)
        node = int(os.environ.get(NODE_ENV, 0))
        self.prefetch = Prefetch(self.baselines, group.cases) if rank > 0 and node == 0 and group.baselines else None
        self.events = open(Path(group.workdir) / f"rank{rank}.jsonl", "a", buffering=1)

    def emit(self, event: events.Event) -> None:
        self.events.write(events.to_line(event) + "\n")

    def error(self, case: Case, exc: Exception) -> dict:
        """This rank's failure of the case, said to the launcher at once (the others may be stuck waiting)."""
        error = {"message": backends.first_line(exc), "traceback": traceback_text()}
        self.emit(events.RankError(self.rank, time.time(), case.case_id, **error))
        return error

    def run(self) -> None:
        for index, case in enumerate(self.group.cases):
            self.emit(events.Start(self.rank, time.time(), case.case_id))
            if case.localize:
                self.localize(case)
                continue
            if self.world_size > 1:  # together: a rank's prefetch (below) is not counted in the case's own time
                dist.barrier()
            output = info = error = None
            try:
                output, info = run_case(self.work, case)
            except Exception as exc:  # noqa: BLE001 - a case's failure is its ERROR, never the group's
                error = self.error(case, exc)
            finally:
                backends.reset_active_backend()
            self.save_coverage(case)
            gathered = [None] * self.world_size
            seconds = info["seconds"] if info else None
            compared = kind_of(case.kind).comparable(output) if error is None else None  # converted once, for both uses
            shape = tuple(compared.shape) if compared is not None else None
            with self.work.phase("gathers"):
                dist.all_gather_object(gathered, {"error": error, "peak_mem_mb": self.work.peak_memory_mb(),
                                                  "seconds": seconds, "shape": shape,
                                                  "load": info.get("load") if info else None,
                                                  "steps": info.get("steps") if info else None,
                                                  "flow_changes": info.get("flow_changes") if info else None})
                differences = self.rank_differences(compared, gathered)
            if self.rank == 0:
                record = self.record(case, output, info, gathered)
                record.rank_max_diff = differences
                record.phases = {name: round(value, 4) for name, value in self.work.phases.items()}
                self.report(record)
            elif self.prefetch is not None and not any(g["error"] for g in gathered):  # else rank 0 measures nothing
                self.prefetch_after(index)
            del output

    def prefetch_after(self, index: int) -> None:
        """A baseline a later case needs, while rank 0 measures this one (harness.engine.baselines.Prefetch). A
        baseline's own failure is shared as its message, for rank 0 to report with the case; a failure of the
        prefetch itself is said once in the launch's log and ends this rank's prefetching (rank 0 computes the rest)."""
        try:
            self.prefetch.after(index, self.rank - 1)
        except Exception:  # noqa: BLE001 - never this rank's case's failure
            print(f"rank {self.rank}: prefetching baselines stopped: {traceback_text()}", file=sys.stderr, flush=True)
            self.prefetch = None
        finally:
            backends.reset_active_backend()

    def localize(self, case: Case) -> None:
        """Where the case breaks (harness.rank.localize); its time is its own, not the case's."""
        started, found, error = time.perf_counter(), None, None
        try:
            found = localize_case(self.work, case, self.rank, self.world_size)
        except Exception as exc:  # noqa: BLE001 - reported with the case, never fatal
            error = self.error(case, exc)
        finally:
            backends.reset_active_backend()
        self.save_coverage(case)
        errors = [None] * self.world_size
        dist.all_gather_object(errors, error)
        if self.rank == 0:
            failed = next(((rank, e) for rank, e in enumerate(errors) if e is not None), None)
            if failed is not None:
                self.report(CaseRecord(case.case_id, error=failed[1]["message"], error_rank=failed[0],
                                       traceback=failed[1]["traceback"]))
            else:
                self.report(CaseRecord(case.case_id, seconds=time.perf_counter() - started,
                                       metrics={"localization": found.to_dict()}))

    def save_coverage(self, case: Case) -> None:
        """`--coverage`: the rank's data saved before the case's gathers, after its launch's last case (and now and
        then): no rank passes the gather before every rank has saved, and the launcher ends the ranks once rank 0
        has reported the last case."""
        if self.tracer is not None:
            self.tracer.after_case(last=case is self.group.cases[-1])

    def rank_differences(self, mine: torch.Tensor | None, gathered: list[dict]) -> list[float | None]:
        """Every rank's output against rank 0's (max abs difference; None for a different shape). In diffusers every
        rank ends with the whole output, so a rank that disagrees is a bug that comparing rank 0 alone would miss."""
        if any(g["error"] is not None for g in gathered):
            return []
        shapes = [g["shape"] for g in gathered]
        if any(shape != shapes[0] for shape in shapes):
            return [0.0 if shape == shapes[0] else None for shape in shapes]
        mine = mine.to(self.work.device)  # NCCL takes CUDA tensors only; `comparable` returns a CPU copy
        theirs = mine.clone()
        dist.broadcast(theirs, src=0)
        difference = float((mine - theirs).abs().max()) if mine.numel() else 0.0
        found = [None] * self.world_size
        dist.all_gather_object(found, difference)
        return found

    def record(self, case: Case, output, info: dict | None, gathered: list[dict]) -> CaseRecord:
        """Rank 0's record of the case: the first rank's error (None as the rank when every rank failed alike,
        diffusers' own refusal), or the kind's metrics with what ran and what it cost on each rank."""
        failed = [(rank, g["error"]) for rank, g in enumerate(gathered) if g["error"] is not None]
        if failed:
            rank, error = failed[0]
            return CaseRecord(case.case_id, error=error["message"], traceback=error["traceback"],
                              error_rank=None if len(failed) == len(gathered) else rank)
        try:
            metrics = measure(self.work, self.baselines, case, output)
            metrics["repeat"] = info.get("repeat")  # the case run twice in this launch (harness.engine.repeat)
        except Exception as exc:  # noqa: BLE001
            return CaseRecord(case.case_id, error=backends.first_line(exc), error_rank=0, traceback=traceback_text())
        per_rank = [round(g["peak_mem_mb"], 1) for g in gathered]
        return CaseRecord(case.case_id, seconds=info["seconds"], forward_s=info["forward_s"],
                          peak_mem_mb=max(per_rank), peak_mem_mb_per_rank=per_rank,
                          seconds_per_rank=[g["seconds"] and round(g["seconds"], 4) for g in gathered],
                          dispatched=info["dispatched"], kernels=info["kernels"],
                          output_placements=info["output_placements"], functions=info["functions"],
                          expected_function=info["expected_function"], comms=info.get("comms"),
                          comms_expected=info.get("comms_expected", []), compiled=info.get("compiled"),
                          load=loaded(gathered), steps=stepped(gathered), step_labels=info.get("step_labels"),
                          flow_changes=flow_changes(gathered), warnings=info.get("warnings") or [],
                          metrics=metrics)

    def report(self, record: CaseRecord) -> None:
        """The case's record to the launcher; one that cannot be written (a value no JSON holds) is the case's
        ERROR, never the end of the launch."""
        try:
            line = events.to_line(events.Result(self.rank, time.time(), record))
        except Exception as exc:  # noqa: BLE001 - a harness bug in one record must not take the other cases down
            failed = CaseRecord(record.case_id, error=f"the case's record could not be written: "
                                                      f"{backends.first_line(exc)}", error_rank=0,
                                traceback=traceback_text())
            line = events.to_line(events.Result(self.rank, time.time(), failed))
        self.events.write(line + "\n")


def loaded(gathered: list[dict]) -> dict | None:
    """How a checkpoint load ran, with every rank's parameters whose local shard differs from `enable`'s (None:
    the `enable` load)."""
    mine = [g.get("load") for g in gathered]
    if mine[0] is None:
        return None
    return {**{key: value for key, value in mine[0].items() if key != "differing"},
            "unconfigured": any(each and each.get("unconfigured") for each in mine),
            "differing": {str(rank): each["differing"] for rank, each in enumerate(mine) if each and each["differing"]}}


def stepped(gathered: list[dict]) -> list[list[int]] | None:
    """Each rank's work per step of a case's denoising loop (harness.flows.denoising); None: the case ran once."""
    return None if gathered[0].get("steps") is None else [each.get("steps") for each in gathered]


def flow_changes(gathered: list[dict]) -> list[list[str] | None] | None:
    """What a flow's calls changed of the model on each rank (harness.flows.state); None: the case has no flow."""
    return None if gathered[0].get("flow_changes") is None else [each.get("flow_changes") for each in gathered]


def init_distributed() -> tuple[int, int]:
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def main(argv: list[str] | None = None) -> int:
    """One rank. A rank that fails outside a case (an import in the shims, init, the group loop, cleanup) writes a
    `fatal` event with its own traceback before it exits, so the launcher reports that, not torchrun's summary."""
    argv = sys.argv[1:] if argv is None else argv
    group = GroupSpec.from_dict(json.loads(Path(argv[0]).read_text()))
    if group.compile_cache:  # read by Inductor when it first compiles
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = group.compile_cache
    rank = int(os.environ.get("RANK", 0))  # torchrun's; the process group does not exist yet
    stacks = open(Path(group.workdir) / f"rank{rank}.stacks", "a")  # open for the process's life
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)  # the launcher asks before it kills a hang
    faulthandler.enable(file=stacks, all_threads=True)  # a death in native code (SIGSEGV, SIGABRT) leaves its stack

    def fatal(stage: str, error: Exception) -> None:
        event = events.Fatal(rank, time.time(), os.getpid(), stage, backends.first_line(error), traceback_text())
        with open(Path(group.workdir) / f"rank{rank}.jsonl", "a") as written:
            written.write(events.to_line(event) + "\n")

    tracer = None
    try:
        tracer = tracing.start(group)  # before the shims below import diffusers
        determinism.quiet_diffusers()
        determinism.strict_fp32()
        cpu.apply()
        backends.install_dispatch_counters()
        rank, world_size = init_distributed()
        worker = Worker(group, rank, world_size, tracer)
        worker.emit(events.Hello(rank, time.time(), os.getpid(), int(os.environ.get(NODE_ENV, 0)),
                                 socket.gethostname()))
    except Exception as error:
        fatal("startup", error)
        raise
    try:
        worker.run()
        worker.emit(events.Done(rank, time.time()))
    except Exception as error:
        fatal("run", error)
        raise
    finally:
        try:
            dist.destroy_process_group()
            if tracer is not None:
                tracer.stop()
        except Exception as error:
            fatal("cleanup", error)
            raise
    return 0


if __name__ == "__main__":
    code = main()  # a failure raises, as before, and Python prints it
    sys.stdout.flush(), sys.stderr.flush()
    # Not Python's own teardown: a gloo worker thread may still be freeing a finished collective, which holds a
    # Python object; taking the GIL from a finalizing interpreter aborts the rank after its Done
    # (docs/reliability.md). The forked ranks of a warm parent end the same way.
    os._exit(code)
