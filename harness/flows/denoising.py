"""A short denoising loop, for the flows whose calls decide per step (a cache): a case of such a flow runs the
transformer several times, as a pipeline does, where every other case runs it once.

Each step runs inside `cache_context("cond", ...)` with where the loop is (step index, timestep, sigma: what SeaCache
reads; releases before 0.41 take the name alone, and their caches keep their own step counts), and its output moves
the latents by a flow-matching Euler step (the same inputs with the next timestep where the output is not the
latents' shape). What each step computed is counted on this rank as the `nn.Linear` calls it made: a cache that
reuses a block or an attention makes fewer, whatever the cache; ranks that decided alike at a step count alike, one
device counts what the cache saved. Torch is imported inside the methods (the flows' registry stays torch-free).
"""

from __future__ import annotations

from collections.abc import Callable

from harness.flows.registry import value_of

# The scheduler's sigmas run from 1 down to LAST_SIGMA; the timestep a cache's callback reads is sigma x TIMESTEPS, as
# flux's and qwenimage's pipelines hand the transformer sigma and their caches the scheduler's timestep.
LAST_SIGMA = 0.2
TIMESTEPS = 1000


def of_flow(name: str) -> Denoising | None:
    """The loop a case of flow `name` runs, or None where the flow declares no steps (one forward)."""
    found = value_of(name).flow
    return Denoising(found.steps) if found is not None and found.steps else None


class Denoising:
    """The loop of one case's model: its steps, the step in progress (what a cache's timestep callback reads) and
    what each step computed on this rank."""

    def __init__(self, steps: int):
        self.steps = steps
        self.sigmas = [1.0 - (1.0 - LAST_SIGMA) * index / steps for index in range(steps + 1)]
        self.sigma = self.sigmas[0]
        self.work: list[int] = []  # nn.Linear calls per step on this rank, of the last run

    def current_timestep(self) -> float:
        """The scheduler's timestep of the step in progress: a cache's `current_timestep_callback`."""
        return self.sigma * TIMESTEPS

    def run(self, model, inputs: dict, forward: Callable) -> object:
        """`forward(model, inputs)` at every step, each inside `cache_context`, its output the next latents' Euler
        step; the last step's output."""
        import torch

        latents, self.work = inputs["hidden_states"], []
        with _Counter(model) as counter:
            for index in range(self.steps):
                self.sigma, following = self.sigmas[index], self.sigmas[index + 1]
                timestep = torch.full_like(inputs["timestep"], self.sigma)
                where = {"step_index": index, "num_inference_steps": self.steps,
                         "timestep": self.current_timestep(), "sigma": self.sigma}
                with model.cache_context("cond", **_taken(model.cache_context, where)):
                    output = forward(model, {**inputs, "hidden_states": latents, "timestep": timestep})
                self.work.append(counter.take())
                if output.shape == latents.shape:
                    latents = latents + (following - self.sigma) * output
        return output


def _taken(cache_context: Callable, where: dict) -> dict:
    """The part of `where` the installed release's `cache_context` takes: all of it where it takes keyword arguments
    (0.41.0 on, with SeaCache), none where it takes the context's name alone (0.36.0 to 0.40: "got an unexpected
    keyword argument 'step_index'")."""
    import inspect

    parameters = inspect.signature(cache_context).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return where
    named = {parameter.name for parameter in parameters}
    return {key: value for key, value in where.items() if key in named}


class _Counter:
    """Counts the calls of every `nn.Linear` of a model while it is entered."""

    def __init__(self, model):
        self.model, self.count, self.handles = model, 0, []

    def __enter__(self) -> _Counter:
        import torch

        self.handles = [module.register_forward_hook(self._seen) for module in self.model.modules()
                        if isinstance(module, torch.nn.Linear)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def _seen(self, *_) -> None:
        self.count += 1

    def take(self) -> int:
        """The calls since the last take."""
        found, self.count = self.count, 0
        return found
