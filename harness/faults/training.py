"""Training faults in the harness's own training loop (harness.rank.training): the context-parallel gradient sum
skipped or doubled, the data-parallel engine never reducing, every data-parallel rank given the same samples."""

from __future__ import annotations

import contextlib

from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("training: the harness skips summing gradients over the context-parallel ranks")
def train_skip_cp_reduction():
    from harness.rank import training

    return patched(training, "reduce_context_parallel", lambda named, groups: None)


@fault("training: the harness sums gradients over the context-parallel ranks twice")
def train_double_cp_reduction():
    from harness.rank import training

    original = training.reduce_context_parallel

    def twice(named, groups):
        original(named, groups)
        original(named, groups)

    return patched(training, "reduce_context_parallel", twice)


@fault("training: the data-parallel engine never reduces the gradients (each rank keeps its own half-batch "
       "gradient)")
def train_skip_dp_reduction():
    from harness.rank import training

    @contextlib.contextmanager
    def no_sync(model):
        if hasattr(model, "no_sync"):  # DDP
            with model.no_sync():
                yield
        elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2: the reduce-scatter is skipped
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        else:
            yield

    return patched(training, "data_parallel_sync", no_sync)


@fault("training: the data-parallel split hands every data-parallel rank the first rank's samples")
def dp_same_samples():
    from harness.rank import training

    original = training.Batch.part
    return patched(training.Batch, "part", lambda self, index, parts: original(self, 0, parts))
