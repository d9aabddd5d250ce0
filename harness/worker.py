"""The torchrun entry point: every rank runs every case of its group; rank 0 measures and reports.

Events go to one JSON-lines file per rank, flushed per line, so the launcher sees progress, a rank's error,
and every finished case even if the group dies later.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from harness import backends, cpu, determinism, faults, image_runs, kernels
from harness.capture import run_model
from harness.compare import abs_err_histogram, tensor_metrics
from harness.dtypes import torch_dtype
from harness.plan import Case
from harness.reference import Reference, read_reference, reference_path
from harness.zoo import get_spec


class Worker:
    def __init__(self, group: dict, rank: int, world_size: int):
        self.group, self.rank, self.world_size = group, rank, world_size
        self.device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if torch.cuda.is_available() \
            else torch.device("cpu")
        self.events = open(Path(group["workdir"]) / f"rank{rank}.jsonl", "a", buffering=1)
        self.references: dict[tuple[str, str, str], Reference] = {}
        self.meshes: dict[tuple, object] = {}
        self.baselines: dict[tuple, object] = {}
        self.weights_dir = group.get("weights_dir")

    def emit(self, event: str, **data) -> None:
        self.events.write(json.dumps({"event": event, "rank": self.rank, "time": time.time(), **data}) + "\n")

    def reference(self, case: Case) -> Reference:
        key = (case.model, case.shape, case.kind)
        if key not in self.references:
            path = reference_path(Path(self.group["references"]), case.model, case.shape, case.kind)
            if case.kind == "image":
                expected = image_runs.config_hash(case.model, self._weights_for(case))
            else:
                expected = get_spec(case.model).config_hash()
            self.references[key] = read_reference(path, expected)
        return self.references[key]

    def _weights_for(self, case: Case):
        return self.weights_dir if case.kind == "image" and case.shape != "default" else None

    def mesh(self, layout):
        spec = layout.mesh_spec()
        if spec is None:
            return None
        if spec not in self.meshes:
            from torch.distributed.device_mesh import init_device_mesh

            self.meshes[spec] = init_device_mesh(self.device.type, spec[0], mesh_dim_names=spec[1])
        return self.meshes[spec]

    def build(self, case: Case):
        """(the model to parallelize, a callable that runs the case once), from the reference's fp32 weights cast
        once to the case's dtype (never down and back up)."""
        reference = self.reference(case)
        if case.kind == "image":
            pipe = image_runs.build(case.model, case.dtype, self.device, reference, self._weights_for(case))
            pipe.transformer.set_attention_backend(case.backend)
            return pipe.transformer, lambda: image_runs.run(pipe, case.model)
        dtype = torch_dtype(case.dtype)
        model = get_spec(case.model).model_class()(**reference.meta["config"])
        model.load_state_dict(reference.weights)
        model = model.to(self.device, dtype).eval()
        # `.clone()`: tensors mapped from the file can sit at unaligned addresses, which moves results by ~1e-7.
        inputs = {
            key: value.to(self.device, dtype if value.is_floating_point() else value.dtype).clone()
            if isinstance(value, torch.Tensor) else value
            for key, value in reference.inputs.items()
        }
        model.set_attention_backend(case.backend)
        return model, lambda: run_model(model, inputs)

    def run_case(self, case: Case):
        started = time.perf_counter()
        model, forward = self.build(case)
        with faults.active(case.fault):
            config = case.layout.diffusers_config(self.mesh(case.layout))
            if config is not None:
                cp_plan = get_spec(case.model).context_parallel_plan(model.config) if case.kind == "tensor" else None
                model.enable_parallelism(config=config, cp_plan=cp_plan)
            backends.reset_dispatches()
            self._sync(reset_peak=True)
            forward_started = time.perf_counter()
            output = forward()
            self._sync()
            forward_s, seconds = time.perf_counter() - forward_started, time.perf_counter() - started
            dispatched = backends.dispatches()
            # A second, profiled run proves the kernels; it stays out of the timings above.
            executed = kernels.profile_kernels(forward, scope=model if case.kind == "image" else None)
        if hasattr(output, "full_tensor"):
            output = output.full_tensor()
        info = {"forward_s": forward_s, "seconds": seconds, "dispatched": dispatched, "kernels": executed}
        return output, info

    def peak_memory_mb(self) -> float:
        """CUDA: the case's peak allocated memory. CPU: the process's peak resident size so far (a high-water mark
        over the launch, not per case: the CPU allocator keeps no per-case statistics)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def _sync(self, reset_peak: bool = False) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if reset_peak:
                torch.cuda.reset_peak_memory_stats(self.device)

    def baseline(self, case: Case):
        """What the dtype alone costs (rank 0 only): the single-device output in the case's dtype, with the case's
        backend for a parallel layout, or with `native` SDPA when the case compares a backend on a single device."""
        backend = case.backend if case.layout.world_size > 1 else "native"
        model_change = case.fault if case.fault in faults.MODEL_CHANGES else None
        key = (case.model, case.shape, case.kind, backend, case.dtype, model_change)
        if key not in self.baselines:
            try:
                _, forward = self.build(replace(case, backend=backend, fault=None))
                with faults.active(model_change):
                    output = forward()
                self.baselines[key] = output.float().cpu() if isinstance(output, torch.Tensor) else output
            except Exception as error:  # noqa: BLE001 - reported with the case, never fatal
                self.baselines[key] = backends.first_line(error)
            finally:
                backends.reset_active_backend()
        return self.baselines[key]

    def measure(self, case: Case, output, info: dict) -> dict:
        reference = self.reference(case)
        baseline = self.baseline(case)
        if case.kind == "image":
            images_dir = Path(self.group["images_dir"]) if self.group.get("images_dir") else None
            low_precision = baseline if case.dtype != "fp32" else None
            return {**image_runs.measure(output, reference, low_precision, images_dir, image_runs.slug(case.case_id)),
                    **info}
        record = {**tensor_metrics(output.float().cpu(), reference.output), **info,
                  "abs_err_hist": abs_err_histogram(output.float(), reference.output)}
        if isinstance(baseline, str):
            record["baseline_error"] = baseline
        else:
            record["baseline"] = tensor_metrics(baseline, reference.output)
            record["vs_baseline_max_abs"] = tensor_metrics(output.float().cpu(), baseline)["max_abs_err"]
        return record

    def run(self) -> None:
        for data in self.group["cases"]:
            case = Case.from_dict(data)
            self.emit("start", case_id=case.case_id)
            output = info = error = None
            try:
                output, info = self.run_case(case)
            except Exception as exc:  # noqa: BLE001 - a case's failure is its ERROR, never the group's
                error = {"message": backends.first_line(exc), "traceback": traceback.format_exc()[-2000:]}
                self.emit("rank_error", case_id=case.case_id, **error)
            finally:
                backends.reset_active_backend()
            gathered = [None] * self.world_size
            seconds = info["seconds"] if info else None
            dist.all_gather_object(gathered, {"error": error, "peak_mem_mb": self.peak_memory_mb(), "seconds": seconds})
            if self.rank == 0:
                if info is not None:
                    info["peak_mem_mb_per_rank"] = [round(g["peak_mem_mb"], 1) for g in gathered]
                    info["peak_mem_mb"] = max(info["peak_mem_mb_per_rank"])
                    info["seconds_per_rank"] = [g["seconds"] and round(g["seconds"], 4) for g in gathered]
                self.report(case, output, info, [g["error"] for g in gathered])
            del output

    def report(self, case: Case, output, info, errors) -> None:
        failed = [(rank, err) for rank, err in enumerate(errors) if err is not None]
        if failed:
            rank, err = failed[0]
            rank = None if len(failed) == len(errors) else rank  # every rank refused: diffusers' own error
            self.emit("result", case_id=case.case_id, error=err["message"], error_rank=rank,
                      traceback=err["traceback"])
            return
        try:
            self.emit("result", case_id=case.case_id, **self.measure(case, output, info))
        except Exception as exc:  # noqa: BLE001
            self.emit("result", case_id=case.case_id, error=backends.first_line(exc), error_rank=0,
                      traceback=traceback.format_exc()[-2000:])


def init_distributed() -> tuple[int, int]:
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    group = json.loads(Path(argv[0]).read_text())
    determinism.quiet_diffusers()
    determinism.strict_fp32()
    cpu.apply()
    backends.install_dispatch_counters()
    rank, world_size = init_distributed()
    worker = Worker(group, rank, world_size)
    worker.emit("hello", pid=os.getpid())
    try:
        worker.run()
        worker.emit("done")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
