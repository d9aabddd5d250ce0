"""The single-device baselines (rank 0 only): what the dtype alone costs, the case's model in its dtype on one
device, with the case's backend for a parallel layout or `native` SDPA when the case compares a backend on one
device, compiled as the case is, the calls of the case's flow made on it (harness.flows); and the other draws of its
noise where the kind asks for them (harness.rank.noise).

Computed once per run: kept for the launch, and handed to later launches through a shared folder (the one-rank
launch runs first, and its cases' own outputs are most of the baselines the others need). A failure is kept as its
message and reported with the case, never fatal.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
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
                    self.kept[key] = self._compute(case, backend, model_change, draw)
                    self._share(key)
        return self.kept[key]

    def offer(self, case: Case, output) -> None:
        """A one-rank case without a fault computed exactly a baseline: its model, dtype and backend on one device."""
        if case.layout.world_size > 1 or case.fault is not None:
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

    def _compute(self, case: Case, backend: str, model_change, draw: str | None):
        kind = kind_of(case.kind)
        try:
            # one device, the reference's weights: shared by every load
            built = kind.build(replace(case, backend=backend, fault=None, load=ENABLE), self.context.reference(case),
                               self.context.device, loading.enabled())
            if draw is not None:
                built.twin(draw)
            self.context.flow_on_one_device(replace(case, backend=backend), built)
            with faults.active(model_change):
                if draw is None:  # a noise draw runs eager: against a compiled baseline it measures compile's own
                    compile_like(case.mode, built.module)  # fusion noise too, without compiling four times more
                return kind.detach(built.run())
        except Exception as error:  # noqa: BLE001 - reported with the case, never fatal
            return backends.first_line(error)
        finally:
            backends.reset_active_backend()
