"""What a rank does for one case, apart from the loop and the events: load (and cache) the reference, build the case
through its kind, apply the layout, run it, prove what ran, and measure against the single-device baseline.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from harness.core.records import Case
from harness.core.reference import Reference, read_reference, reference_path
from harness.kinds import kind_of
from harness.rank import backends, comms_check, faults, localize, training
from harness.rank.recorder import RunRecorder


class CaseWork:
    """Per-rank caches shared by every case of a launch: references, device meshes and single-device baselines."""

    def __init__(self, references: Path, images_dir: Path | None, device: torch.device, shared: Path | None = None):
        self.root, self.images_dir, self.device = Path(references), images_dir, device
        self.shared = shared  # where this run's launches hand each other baselines (rank 0 only; None: not shared)
        self.references: dict[tuple, Reference] = {}
        self.meshes: dict[tuple, object] = {}
        self.baselines: dict[tuple, object] = {}
        self.phases: Counter = Counter()  # seconds per phase of the case in progress (where a launch's time goes)

    @contextlib.contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - started

    def reference(self, case: Case) -> Reference:
        key = (case.model, case.shape, case.kind, case.weights_dir)
        if key not in self.references:
            path = reference_path(self.root, case.model, case.shape, case.kind)
            with self.phase("reference loading"):
                self.references[key] = read_reference(path, kind_of(case.kind).reference_hash(case))
        return self.references[key]

    def mesh(self, layout):
        spec = layout.mesh_spec()
        if spec is None:
            return None
        if spec not in self.meshes:
            from torch.distributed.device_mesh import init_device_mesh

            self.meshes[spec] = init_device_mesh(self.device.type, spec[0], mesh_dim_names=spec[1])
        return self.meshes[spec]

    def run(self, case: Case) -> tuple[object, dict]:
        """The case's output on this rank, and what ran: timings, dispatched backends, executed kernels."""
        started = time.perf_counter()
        self.phases.clear()
        reference = self.reference(case)
        with self.phase("model build"):
            built = kind_of(case.kind).build(case, reference, self.device)
        with faults.active(case.fault):
            with self.phase("parallel setup"):
                self._apply_layout(case, built)
            backends.reset_dispatches()
            recorder = RunRecorder(built.module, built.kernel_scope)
            self._sync(reset_peak=True)
            forward_started = time.perf_counter()
            # The proof is recorded in this very run (harness.rank.recorder: a few ms a case), never in a second one.
            output = built.run_recorded(recorder)
            self._sync()
            forward_s, seconds = time.perf_counter() - forward_started, time.perf_counter() - started
            self.phases["forward"] += forward_s
            dispatched, functions = backends.dispatches(), backends.functions_run()
            proof = self._prove_comms(case, built, recorder) if case.layout.world_size > 1 else {}
        placements = None
        if hasattr(output, "full_tensor"):  # materialised to compare, and reported: diffusers returns plain tensors
            placements = str(tuple(output.placements))
            output = output.full_tensor()
        return output, {"forward_s": forward_s, "seconds": seconds, "dispatched": dispatched,
                        "kernels": recorder.executed(), "output_placements": placements, "functions": functions,
                        "expected_function": backends.expected_function(case.backend), **proof}

    @staticmethod
    def _prove_comms(case: Case, built, recorder: RunRecorder) -> dict:
        """The collectives the run performed, and what the layout predicts it must have (harness.rank.comms_check)."""
        expected = comms_check.predict(built.module, case.layout, built.cp_plan, recorder)
        return {"comms": recorder.recorded(), "comms_expected": [item.to_dict() for item in expected]}

    def _apply_layout(self, case: Case, built) -> None:
        """diffusers' own `enable_parallelism`, then what the kind adds on the mesh (the data-parallel engine)."""
        mesh = self.mesh(case.layout)
        config = case.layout.diffusers_config(mesh)
        if config is not None:
            built.module.enable_parallelism(config=config, cp_plan=built.cp_plan)
        if built.parallelize is not None:
            built.parallelize(mesh)

    def localize(self, case: Case, rank: int, world_size: int) -> dict | None:
        """Where the case breaks (rank 0; None elsewhere): every module's output under the layout against the same
        module on one device, from the reference's weights, without the case's fault, in fp32 and, for low
        precision, in the case's dtype (its own noise is not a divergence)."""
        reference, kind = self.reference(case), kind_of(case.kind)
        built = kind.build(case, reference, self.device)
        with faults.active(case.fault):
            self._apply_layout(case, built)
            packed = training.packed_parameters(built.module, case.layout.tp) if case.layout.tp > 1 else {}
            records, grads, untraced = self._trace(built, 1.0 / case.layout.dp)
        backends.reset_active_backend()
        gathered = localize.gather_records(records, world_size)
        gathered_grads = localize.gather_records(grads, world_size) if grads is not None else None
        if rank != 0:
            return None
        single, single_grads, _ = self._single_trace(case, "fp32", reference)
        own, own_grads, _ = self._single_trace(case, case.dtype, reference) if case.dtype != "fp32" \
            else (None, None, None)
        outputs, inputs = ({name[:-len(".weight")]: (blocks, degree) for name, (dim, blocks, degree) in packed.items()
                            if name.endswith(".weight") and dim == side} for side in (0, 1))
        lengths = kind.split_lengths(case) if case.layout.is_context_parallel else None
        streams = tuple((lengths or {}).values())
        found = localize.localize(gathered, single, own, outputs, streams, data_parallel=case.layout.dp)
        if gathered_grads is not None:  # backward order: the first module whose backward hands on a wrong gradient
            found["backward"] = localize.localize(gathered_grads, single_grads, own_grads, inputs, streams,
                                                  gradients=True, data_parallel=case.layout.dp,
                                                  called={name for name, _, _ in single})
        found["summary"] = localize.summary(found)
        if untraced is not None:
            found["backward_untraced"] = untraced
        return found

    @staticmethod
    def _trace(built, scale: float) -> tuple[list, list | None, str | None]:
        """The forward records, the backward's (train), and why the backward could not be traced (every rank
        fails alike: full backward hooks around some tensor-parallel models' DTensors)."""
        if built.loss is not None:
            try:
                return (*localize.trace_backward(built.module, built.loss, scale), None)
            except Exception as error:  # noqa: BLE001 - said in the localization, the forward still traced
                untraced = f"backward not traced: {backends.first_line(error)}"
                return localize.trace(built.module, built.forward or built.run), None, untraced
        return localize.trace(built.module, built.forward or built.run), None, None

    def _single_trace(self, case: Case, dtype: str, reference) -> tuple[list, list | None, str | None]:
        from harness.core.layouts import Layout
        backend = case.backend if case.layout.world_size > 1 else "native"
        single = replace(case, layout=Layout("single"), backend=backend, dtype=dtype, fault=None)
        built = kind_of(case.kind).build(single, reference, self.device)
        try:
            return self._trace(built, 1.0)
        finally:
            backends.reset_active_backend()

    def measure(self, case: Case, output) -> dict:
        """The kind's metrics against the reference and the single-device baseline of the case's dtype (and its
        noise twin where the kind judges by the spread of the two)."""
        kind = kind_of(case.kind)
        self._offer_baseline(case, output)
        reference, baseline = self.reference(case), self.baseline(case)
        draws = {name: self.baseline(case, draw=name) for name in kind.draws_for(case)}
        with self.phase("metrics and images"):
            return kind.measure(output, reference, baseline, case, self.images_dir, draws)

    def baseline(self, case: Case, draw: str | None = None):
        """What the dtype alone costs (rank 0 only): the single-device output in the case's dtype, with the case's
        backend for a parallel layout, or with `native` SDPA when the case compares a backend on a single device.
        Computed once per run: kept here for this launch, and handed to later launches through `shared` (the
        one-rank launch runs first, and its cases' own outputs are most of the baselines the others need). A
        failure is kept as its message, reported with the case, never fatal. `draw`: the same run with other
        rounding noise (harness.rank.noise)."""
        backend = case.backend if case.layout.world_size > 1 else "native"
        model_change = case.fault if case.fault in faults.MODEL_CHANGES else None
        key = self._baseline_key(case, backend, model_change, draw)
        if key not in self.baselines:
            with self.phase("baselines"):
                self.baselines[key] = self._shared_baseline(key)
                if self.baselines[key] is None:
                    self.baselines[key] = self._compute_baseline(kind_of(case.kind), case, backend, model_change,
                                                                 draw)
                    self._share(key)
        return self.baselines[key]

    @staticmethod
    def _baseline_key(case: Case, backend: str, model_change: str | None, draw: str | None = None) -> tuple:
        return case.model, case.shape, case.kind, case.weights_dir, backend, case.dtype, model_change, draw

    def _offer_baseline(self, case: Case, output) -> None:
        """A one-rank case without a fault computed exactly a baseline: its model, dtype and backend on one device."""
        if case.layout.world_size > 1 or case.fault is not None:
            return
        key = self._baseline_key(case, case.backend, None)
        if key not in self.baselines:
            self.baselines[key] = kind_of(case.kind).detach(output)
            self._share(key)

    def _baseline_file(self, key: tuple) -> Path:
        return self.shared / (hashlib.sha256(repr(key).encode()).hexdigest()[:24] + ".pt")

    def _shared_baseline(self, key: tuple):
        """The baseline an earlier launch of this run left, or None. (The folder is this run's own work folder,
        emptied when the run starts: no stale or foreign file is read.)"""
        if self.shared is None or not self._baseline_file(key).exists():
            return None
        return torch.load(self._baseline_file(key), weights_only=False)

    def _share(self, key: tuple) -> None:
        if self.shared is None:
            return
        self.shared.mkdir(parents=True, exist_ok=True)
        path = self._baseline_file(key)
        partial = path.with_suffix(".partial")
        torch.save(self.baselines[key], partial)
        partial.replace(path)  # whole or absent, whatever happens to this rank

    def _compute_baseline(self, kind, case: Case, backend: str, model_change, draw: str | None):
        try:
            built = kind.build(replace(case, backend=backend, fault=None), self.reference(case), self.device)
            if draw is not None:
                built.twin(draw)
            with faults.active(model_change):
                return kind.detach(built.run())
        except Exception as error:  # noqa: BLE001 - reported with the case, never fatal
            return backends.first_line(error)
        finally:
            backends.reset_active_backend()

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
