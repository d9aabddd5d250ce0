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
from harness.core.layouts import Layout
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
        key, backend, model_change = self.key_of(case, draw), _backend(case), _model_change(case)
        if key not in self.kept:
            with self.context.phase("baselines"):
                self.kept[key] = self._shared(key)
                if self.kept[key] is None:
                    self.kept[key], record = self._compute(case, backend, model_change, draw)
                    if record is not None:  # shared first: another rank that finds the output finds its record
                        self.kept[(*key, _RECORD)] = record
                        self._share((*key, _RECORD))
                    self._share(key)
                elif (*key, _RECORD) not in self.kept and self._shared((*key, _RECORD)) is not None:
                    self.kept[(*key, _RECORD)] = self._shared((*key, _RECORD))
        return self.kept[key]

    def record_of(self, case: Case) -> FlowRecord | None:
        """What the case's flow did on its one-device baseline (None: no flow, or the baseline failed)."""
        self.of(case)
        return self.kept.get((*self.key_of(case), _RECORD))

    def wanted(self, case: Case) -> list[tuple[Case, str | None]]:
        """What measuring `case` asks of the baselines (harness.engine.casework.measure), as (case, draw): for a
        flow the fp32 one-device run of its calls, then the case's own, then its noise draws."""
        asked = [(case, None), *((case, name) for name in kind_of(case.kind).draws_for(case))]
        return [(flow_one_device(case), None), *asked] if case.flow != flows.NONE else asked

    def offer(self, case: Case, output) -> None:
        """A one-rank case without a fault computed exactly a baseline: its model, dtype and backend on one device.
        Not one with a flow: its baseline keeps a record of the calls (`FlowRecord`), made apart."""
        if case.layout.world_size > 1 or case.fault is not None or case.flow != flows.NONE:
            return
        key = self._key(case, case.backend, None)
        if key not in self.kept:
            self.kept[key] = kind_of(case.kind).detach(output)
            self._share(key)

    def key_of(self, case: Case, draw: str | None = None) -> tuple:
        return self._key(case, _backend(case), _model_change(case), draw)

    def is_shared(self, key: tuple) -> bool:
        return self.shared is not None and self._file(key).exists()

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

    def _build(self, case: Case, backend: str):
        """The case's one-device build: its flow's inputs and loop, none of its calls (the caller makes them)."""
        return kind_of(case.kind).build(replace(case, backend=backend, fault=None, load=ENABLE),
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
            built = self._build(case, backend)
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


class Prefetch:
    """A rank other than 0 waits while rank 0 computes a case's single-device baselines. Instead, while it does, the
    rank computes and shares one baseline a later case of the launch will ask for that no earlier launch or rank
    has left (ranks 1, 2, ... take the first, second, ... missing one): rank 0 then finds it in the shared folder
    (or computes it itself, where a rank died before sharing it). Only then: a rank that computed while rank 0 had
    nothing to compute would make rank 0 wait for it instead."""

    def __init__(self, baselines: Baselines, cases: list[Case]):
        self.baselines = baselines
        self.asked = [[(baselines.key_of(each, draw), each, draw) for each, draw in baselines.wanted(case)]
                      for case in cases]
        self.present: set[tuple] = set()  # keys whose file exists (a shared baseline is never removed in a run)

    def after(self, index: int, share: int) -> None:
        """While rank 0 measures case `index`, if it computes a baseline for it: one as costly (compiled, or eager,
        as the costliest rank 0 computes), never one that case asks for (rank 0 is computing those)."""
        seen, missing = {key for key, _, _ in self.asked[index]}, []
        computed = [(case, draw) for key, case, draw in self.asked[index] if not self._shared(key)]
        if not computed:
            return
        costly = any(_compiled(case, draw) for case, draw in computed)
        for asked in self.asked[index + 1:]:
            for key, case, draw in asked:
                if key in seen or self._shared(key) or _compiled(case, draw) != costly:
                    continue
                seen.add(key)
                missing.append((key, case, draw))
            if len(missing) > share:
                key, case, draw = missing[share]
                self.baselines.of(case, draw)
                self.present.add(key)
                return

    def _shared(self, key: tuple) -> bool:
        if key not in self.present and self.baselines.is_shared(key):
            self.present.add(key)
        return key in self.present


def _compiled(case: Case, draw: str | None) -> bool:
    """A compiled baseline costs a compile (tens of seconds on a CPU), an eager one a forward (a noise draw runs
    eager, but for a flow that compiles: its draws make its calls too)."""
    return flows.compiled_by(case.flow) is not None or (case.mode != EAGER and draw is None)


def _backend(case: Case) -> str:
    """A parallel case's baseline runs its backend on one device; a one-rank case compares its backend with SDPA's."""
    return case.backend if case.layout.world_size > 1 else "native"


def _model_change(case: Case) -> str | None:
    """A fault that stands for a change to diffusers is in force on one device too."""
    return case.fault if faults.is_model_change(case.fault) else None


def flow_one_device(case: Case) -> Case:
    """The run a flow case is judged against: the same calls on one device, fp32, eager, native SDPA, the
    reference's weights (harness.engine.casework.flow_reference)."""
    return replace(case, layout=Layout("single"), backend="native", dtype=flows.ONE_DEVICE_DTYPE, mode=EAGER,
                   load=ENABLE, fault=None)


_RECORD = "flow record"  # the key of a flow baseline's record, beside its output's
