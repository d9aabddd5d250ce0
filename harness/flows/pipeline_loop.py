"""The image kind's loop for a flow that decides per step (a cache): the pipeline's own `__call__`, its scheduler,
its branches and its own `cache_context` calls, as a user runs it, where the tensor kind runs a loop of the
harness's (harness.flows.denoising).

The pipeline is called with `steps` steps and, where its model's pipeline guides (`ModelSpec.cache_contexts`), with
a negative prompt and the harness's loop's guidance scale, so that it runs both branches each step. Around the call
the loop records, without changing what the pipeline does: each transformer call's `nn.Linear` calls (what it
computed on this rank: a cache that reused makes fewer), and the cache context the pipeline opened around it, from
its own `cache_context` call. A cache's timestep callback reads the pipeline's `current_timestep`, as the caching
guide's recipe passes `lambda: pipe.current_timestep`. Torch is imported inside the methods.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from harness.flows.denoising import GUIDANCE, LinearCalls
from harness.flows.registry import value_of


def of_flow(name: str, spec, pipe) -> PipelineLoop | None:
    """The loop a picture of flow `name` runs through `pipe`, the pipeline of the zoo model `spec`; None where the
    flow declares no steps (the pipeline's plain call)."""
    found = value_of(name).flow
    if found is None or not found.steps:
        return None
    return PipelineLoop(pipe, found.steps, spec.cache_contexts)


class PipelineLoop:
    """What one case's pipeline computed per transformer call, with the denoising loop's interface
    (harness.flows.denoising.Denoising): `steps`, `contexts`, `guided`, `current_timestep`, `work`, `labels` and
    `branch_models`."""

    def __init__(self, pipe, steps: int, contexts: tuple[str, ...]):
        self.pipe, self.steps, self.contexts = pipe, steps, contexts
        self.work: list[int] = []  # nn.Linear calls per transformer call of the last run, on this rank
        self.labels: list[str] = []  # "step 0 cond", ...: the step and the context the pipeline opened around it
        # a transformer of its own for each context the pipeline opens, in place of its one (one device's
        # equivalent of a cache that keeps a state per context: harness.flows.caches.PER_BRANCH); None: its own
        self.branch_models: dict | None = None

    @property
    def guided(self) -> bool:
        return len(self.contexts) > 1

    def current_timestep(self):
        """The pipeline's timestep of the step in progress: a cache's `current_timestep_callback`."""
        return self.pipe.current_timestep

    def run(self, call: Callable[[int, float | None], object]) -> object:
        """`call(steps, guidance)`: the pipeline's call, guided by that scale (None: one branch a step, the pipeline's
        plain call); what it returns. Each transformer call's work and context are
        recorded; with `branch_models`, each call runs the model of the context the pipeline opened around it."""
        transformer, models = self.pipe.transformer, self.branch_models or {}
        self.work, self.labels = [], []
        opened = _OpenedContexts(transformer, models)
        with LinearCalls(transformer, *dict.fromkeys(models.values())) as counter, opened:
            handle = transformer.register_forward_hook(lambda *_: self._took(counter.take(), opened.name))
            try:
                return call(self.steps, GUIDANCE if self.guided else None)
            finally:
                handle.remove()

    def _took(self, work: int, context: str | None) -> None:
        step = sum(1 for label in self.labels if label.endswith(f" {context}"))
        self.labels.append(f"step {step} {context}" if context else f"call {len(self.labels)} (no cache context)")
        self.work.append(work)


class _OpenedContexts:
    """While entered, the name of the `cache_context` the pipeline has open on `transformer` (`name`; None outside
    one). Its own method is called as it was: this only records. With `models`, the context is opened on the model
    of that name instead, and the transformer's call runs that model."""

    def __init__(self, transformer, models: dict):
        self.transformer, self.models, self.name = transformer, models, None

    def __enter__(self) -> _OpenedContexts:
        own, models = self.transformer.cache_context, self.models

        @contextlib.contextmanager
        def recorded(name, *args, **kwargs):
            self.name = name
            try:
                with (models[name].cache_context if models else own)(name, *args, **kwargs):
                    yield
            finally:
                self.name = None

        self.transformer.cache_context = recorded  # an instance attribute: the class's method stays as it was
        if models:
            self.transformer.forward = lambda *args, **kwargs: models[self.name](*args, **kwargs)
        return self

    def __exit__(self, *exc) -> None:
        del self.transformer.cache_context
        if self.models:
            del self.transformer.forward
