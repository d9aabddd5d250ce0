"""benchmarks/heap_stress.py's switches, for the processes of one stress round: each suspect of the ranks' heap
corruption that `HEAP_STRESS_OFF` (comma-separated) names is switched off as its module is imported (this folder is
put first on PYTHONPATH, so every interpreter of the round, the warm parent and torchrun's ranks among them, runs
this file as it starts).

- `recorder`: the comms recorder's TorchDispatchMode is never entered (its function mode, which names SDPA's math
  kernel, still is): the case's proof then lacks kernels and collectives, so verdicts change; deaths are what counts.
- `async`: every functional collective is waited for as it is issued (`wait_tensor` where torch would hand back an
  AsyncCollectiveTensor), so no gloo work is in flight while Python goes on.

- `one_thread`: the workaround itself (harness.rank.cpu gives each gloo group one worker thread): off, each group has
  gloo's two again, as before 2026-12-06.

Inductor's CPU kernels are switched off by the round's modes (`aot_eager` for `compile`), the fork by
`--rank-start torchrun`: neither needs a patch.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

OFF = {name for name in os.environ.get("HEAP_STRESS_OFF", "").split(",") if name}


def _no_dispatch_mode(module) -> None:
    original = module.RunRecorder.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._modes = tuple(mode for mode in self._modes if mode is not self.dispatched)

    module.RunRecorder.__init__ = init


def _synchronous_collectives(module) -> None:
    module._maybe_wrap_tensor = module.wait_tensor


def _two_gloo_threads(module) -> None:
    module._gloo_one_worker_thread = lambda: None


PATCHES = {"recorder": ("harness.rank.recorder", _no_dispatch_mode),
           "async": ("torch.distributed._functional_collectives", _synchronous_collectives),
           "one_thread": ("harness.rank.cpu", _two_gloo_threads)}
UNKNOWN = OFF - set(PATCHES) - {"inductor", "fork"}
if UNKNOWN:
    raise SystemExit(f"HEAP_STRESS_OFF: unknown suspect(s) {sorted(UNKNOWN)}")
WANTED = {PATCHES[name][0]: PATCHES[name][1] for name in OFF if name in PATCHES}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a wanted module it asks the other finders, then patches it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in WANTED:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run, patch=WANTED[name]):
                    run(module)
                    patch(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


if WANTED:
    sys.meta_path.insert(0, _PatchAfterImport())
