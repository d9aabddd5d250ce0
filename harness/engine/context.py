"""A rank's state shared by every case of its launch: the device, the references read so far, the device meshes
built so far, and the time each phase of the case in progress took."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from harness import flows
from harness.core.dtypes import torch_dtype
from harness.core.records import Case
from harness.core.reference import Reference, read_reference, reference_path
from harness.kinds import kind_of
from harness.loads import load_of
from harness.rank import loading
from harness.rank.compiled import fresh_compiler


class RankContext:
    def __init__(self, references: Path, images_dir: Path | None, device: torch.device,
                 checkpoints: Path | None = None):
        self.root, self.images_dir, self.device = Path(references), images_dir, device
        self.checkpoints = checkpoints  # the run's checkpoint folders for the from_pretrained loads
        self.references: dict[tuple, Reference] = {}
        self.meshes: dict[tuple, object] = {}
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
            path = reference_path(self.root, case.model, case.shape, kind_of(case.kind).reference_kind)
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

    def build(self, case: Case, reference: Reference):
        """The case built through its kind, handed the case's load plan (harness.rank.loading.plan_for) for its
        model: a checkpoint load gives `from_pretrained` the layout's config here, so its parallelism is applied in
        this build."""
        load = loading.plan_for(case, self.checkpoints, self.mesh(case.layout))
        with self.phase("model build"):
            return kind_of(case.kind).build(case, reference, self.device, load)

    def apply_layout(self, case: Case, built, compiled=None) -> list[str] | None:
        """diffusers' own `enable_parallelism` (unless the model's load gave `from_pretrained` the config), with the
        case's flow (harness.flows) called before or after it, then what the kind adds on the mesh (the data-parallel
        engine); what the flow's calls changed of the model on this rank (None: no flow). A flow that compiles does
        so through `compiled` (harness.rank.compiled.CompiledRun). PyTorch's context parallelism is not applied
        here: it wraps the run (`torch_context_parallel`)."""
        mesh = None if built.own_mesh else self.mesh(case.layout)
        config = None if load_of(case.load).checkpoint else case.layout.diffusers_config(mesh)
        flow = flows.value_of(case.flow)
        setting = flows.Setting(self.device, case.backend, torch_dtype(case.dtype), config, built.cp_plan,
                                built.pipeline, built.denoising)
        if compiled is not None:
            setting = replace(setting, compile_backend=compiled.backend)
        before = flows.make_at(flow, flows.BEFORE, built.module, setting)
        if config is not None:
            built.module.enable_parallelism(config=config, cp_plan=built.cp_plan)
        after = flows.make_at(flow, flows.AFTER, built.module, setting)
        if built.parallelize is not None:
            built.parallelize(mesh)
        return before if before is not None else after

    def flow_on_one_device(self, case: Case, built, after_each=None) -> list[str] | None:
        """The calls of the case's flow on a one-device build of it (no parallelism to come before or after), with
        `after_each(index, call)` between them: what a flow case is judged against, and traced against where it
        fails; what they changed of the model (None: no flow)."""
        value = flows.value_of(case.flow)
        if value.flow is None:
            return None
        if value.flow.compiles:
            fresh_compiler()  # its graphs this run's own, as a compiled case's are
        return flows.make(value.flow, built.module, self.one_device_setting(case, built), after_each)

    def one_device_setting(self, case: Case, built) -> flows.Setting:
        """What a flow's call is given on one device: no parallel config."""
        return flows.Setting(self.device, case.backend, torch_dtype(case.dtype), pipeline=built.pipeline,
                             denoising=built.denoising)

    def torch_context_parallel(self, case: Case, built):
        """PyTorch's `context_parallel` around the run for a tcp layout (harness.rank.torch_cp); else nothing."""
        if not case.layout.is_torch_context_parallel:
            return contextlib.nullcontext()
        from harness.rank import torch_cp

        return torch_cp.sharded(case.layout, self.mesh(case.layout), built.torch_cp_buffers())

    def peak_memory_mb(self) -> float:
        """CUDA: the case's peak allocated memory. CPU: the process's peak resident size so far (a high-water mark
        over the launch, not per case: the CPU allocator keeps no per-case statistics)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def sync(self, reset_peak: bool = False) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if reset_peak:
                torch.cuda.reset_peak_memory_stats(self.device)
