"""The single-device baselines (rank 0 only): what the dtype alone costs, the case's model in its dtype on one
device, with the case's backend for a parallel layout or `native` SDPA when the case compares a backend on one
device, compiled as the case is, the calls of the case's flow made on it (harness.flows, with what they did: a
`FlowRecord`); and the other draws of its noise where the kind asks for them (harness.rank.noise).

Computed once per run: kept for the launch, and handed to later launches through a shared folder (the one-rank
launch runs first, and its cases' own outputs are most of the baselines the others need). A failure is kept as its
message and reported with the case, never fatal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from harness import faults, flows
from harness.core.modes import EAGER
from harness.core.records import Case
from harness.engine.context import RankContext
from harness.kinds import kind_of
from harness.loads import ENABLE
from harness.rank import backends, loading
from harness.rank.compiled import compile_like


@dataclass
class FlowRecord:
    """What a flow's calls did on one device (harness.flows): what they changed of the model, the output after each
    call but the last (where the kind's run can be repeated without side effects), and the output of the model the
    calls must equal, reached another way (`Flow.equals`; a string: why it could not be had; None: none declared)."""

    changes: list[str]
    between: list = field(default_factory=list)
    equals: object = None


class Baselines:
    def __init__(self, context: RankContext, shared: Path | None = None):
        self.context = context
        self.shared = shared  # where this run's launches hand each other baselines (None: not shared)
        self.kept: dict[tuple, object] = {}

    def of(self, case: Case, draw: str | None = None):
        """The baseline of `case` (or its noise draw `draw`): an output, or the message of its failure."""
        backend = case.backend if case.layout.world_size > 1 else "native"
        model_change = case.fault if faults.is_model_change(case.fault) else None
        key = self._key(case, backend, model_change, draw)
        if key not in self.kept:
            with self.context.phase("baselines"):
                self.kept[key] = self._shared(key)
                if self.kept[key] is None:
                    self.kept[key], record = self._compute(case, backend, model_change, draw)
                    self._share(key)
                    if record is not None:
                        self.kept[(*key, _RECORD)] = record
                        self._share((*key, _RECORD))
                elif (*key, _RECORD) not in self.kept and self._shared((*key, _RECORD)) is not None:
                    self.kept[(*key, _RECORD)] = self._shared((*key, _RECORD))
        return self.kept[key]

    def record_of(self, case: Case) -> FlowRecord | None:
        """What the case's flow did on its one-device baseline (None: no flow, or the baseline failed)."""
        self.of(case)
        backend = case.backend if case.layout.world_size > 1 else "native"
        model_change = case.fault if faults.is_model_change(case.fault) else None
        return self.kept.get((*self._key(case, backend, model_change), _RECORD))

    def offer(self, case: Case, output) -> None:
        """A one-rank case without a fault computed exactly a baseline: its model, dtype and backend on one device.
        Not one with a flow: its baseline keeps a record of the calls (`FlowRecord`), made apart."""
        if case.layout.world_size > 1 or case.fault is not None or case.flow != flows.NONE:
            return
        key = self._key(case, case.backend, None)
        if key not in self.kept:
            self.kept[key] = kind_of(case.kind).detach(output)
            self._share(key)

    @staticmethod
    def _key(case: Case, backend: str, model_change: str | None, draw: str | None = None) -> tuple:
        """A compiled case's baseline is compiled the same way: compile's own fusion noise is in its budget."""
        mode = () if case.mode == EAGER else (case.mode,)  # eager keys (and their files) as they were
        flow = () if case.flow == flows.NONE else (case.flow,)  # the same calls on one device (harness.flows)
        return case.model, case.shape, case.kind, case.weights_dir, backend, case.dtype, model_change, draw, *mode, \
            *flow

    def _file(self, key: tuple) -> Path:
        return self.shared / (hashlib.sha256(repr(key).encode()).hexdigest()[:24] + ".pt")

    def _shared(self, key: tuple):
        """The baseline an earlier launch of this run left, or None. (The folder is this run's own work folder,
        emptied when the run starts: no stale or foreign file is read.)"""
        if self.shared is None or not self._file(key).exists():
            return None
        return torch.load(self._file(key), weights_only=False)

    def _share(self, key: tuple) -> None:
        if self.shared is None:
            return
        self.shared.mkdir(parents=True, exist_ok=True)
        path = self._file(key)
        partial = path.with_suffix(".partial")
        torch.save(self.kept[key], partial)
        partial.replace(path)  # whole or absent, whatever happens to this rank

    def _compute(self, case: Case, backend: str, model_change, draw: str | None) -> tuple[object, FlowRecord | None]:
        """The baseline's output (or the message of its failure), and what the case's flow did on it."""
        kind, record = kind_of(case.kind), None
        try:
            # one device, the reference's weights: shared by every load
            built = self._build(case, backend)
            if draw is not None:
                built.twin(draw)
            record = self._flow(replace(case, backend=backend), built, draw)
            with faults.active(model_change):
                if draw is None:  # a noise draw runs eager: against a compiled baseline it measures compile's own
                    compile_like(case.mode, built.module)  # fusion noise too, without compiling four times more
                output = kind.detach(built.run())
            if record is not None:
                record.equals = self._equivalent(case, backend)
            return output, record
        except Exception as error:  # noqa: BLE001 - reported with the case, never fatal
            return backends.first_line(error), None
        finally:
            backends.reset_active_backend()

    def _build(self, case: Case, backend: str, flow: str | None = None):
        return kind_of(case.kind).build(replace(case, backend=backend, fault=None, load=ENABLE, flow=flow or case.flow),
                                        self.context.reference(case), self.context.device, loading.enabled())

    def _flow(self, case: Case, built, draw: str | None) -> FlowRecord | None:
        """The flow's calls on the one-device build; with the output after each but the last where the kind's run
        can be repeated (a noise draw takes none of them: only the calls)."""
        kind, between = kind_of(case.kind), []
        taken = kind.reruns and draw is None
        changes = self.context.flow_on_one_device(
            case, built, (lambda index, call: between.append(kind.detach(built.run()))) if taken else None)
        return None if changes is None or draw is not None else FlowRecord(changes, between)

    def _equivalent(self, case: Case, backend: str):
        """The output of the model the flow's calls must equal, reached its other way on a fresh build, eager; None
        where the flow declares none (or its loop has one branch), or the message of its failure."""
        equals = flows.value_of(case.flow).flow.equals
        if equals is None:
            return None
        try:
            if equals.per_context:
                return self._per_context(case, backend)
            built = self._build(case, backend, flows.NONE)
            if equals.code is not None:
                equals.code(built.module, self.context.one_device_setting(replace(case, backend=backend), built))
            return kind_of(case.kind).detach(built.run())
        except Exception as error:  # noqa: BLE001 - reported with the case, never fatal
            return backends.first_line(error)
        finally:
            backends.reset_active_backend()

    def _per_context(self, case: Case, backend: str):
        """The case's loop with the flow's calls made on a model of its own for each branch (None: one branch)."""
        case = replace(case, backend=backend)
        built = self._build(case, backend)
        loop = built.denoising
        if loop is None or not loop.guided:
            return None
        loop.branch_models = {}
        for context in loop.contexts:
            branch = self._build(case, backend)
            self.context.flow_on_one_device(case, replace(branch, denoising=loop))
            loop.branch_models[context] = branch.module
        return kind_of(case.kind).detach(built.run())


_RECORD = "flow record"  # the key of a flow baseline's record, beside its output's
