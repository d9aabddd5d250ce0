"""A short denoising loop, for the flows whose calls decide per step (a cache): a case of such a flow runs the
transformer several times, as a pipeline does, where every other case runs it once.

Each step runs the model's pipeline's branches, each inside its own `cache_context` with where the loop is (step
index, timestep, sigma: what SeaCache reads; releases before 0.41 take the name alone, and their caches keep their
own step counts): true classifier-free guidance (`cond`, then `uncond` with the negative prompt's embeddings, as the
Flux, QwenImage and Wan pipelines call them with `true_cfg_scale` or `guidance_scale` above 1; each cache keeps a
state per context) or the one branch of a guidance-distilled pipeline (harness.catalogue.zoo.ModelSpec's
`cache_contexts`). The guided output moves the latents by a flow-matching Euler step (the same inputs with the next
timestep where the output is not the latents' shape). What each branch of each step computed is counted on this rank
as the `nn.Linear` calls it made: a cache that reuses a block or an attention makes fewer, whatever the cache; ranks
that decided alike count alike, one device counts what the cache saved. Torch is imported inside the methods (the
flows' registry stays torch-free).
"""

from __future__ import annotations

from collections.abc import Callable

from harness.flows.registry import value_of

# The scheduler's sigmas run from 1 down to LAST_SIGMA; the timestep a cache's callback reads is sigma x TIMESTEPS, as
# the pipelines hand their caches the scheduler's timestep (and the transformer sigma x the model's timestep scale).
LAST_SIGMA = 0.2
TIMESTEPS = 1000
# QwenImage's default true_cfg_scale; a picture's pipeline is called with it too (harness.flows.pipeline_loop)
GUIDANCE = 4.0
# The prompt's embeddings: in the unconditional branch the negative prompt's take their place (here the prompt's,
# negated: another prompt of the same shape, the same on every rank and every process)
PROMPT_INPUTS = ("encoder_hidden_states", "pooled_projections")


def of_flow(name: str, spec=None) -> Denoising | None:
    """The loop a case of flow `name` runs on the zoo model `spec` (its pipeline's branches and timestep scale), or
    None where the flow declares no steps (one forward)."""
    found = value_of(name).flow
    if found is None or not found.steps:
        return None
    if spec is None:
        return Denoising(found.steps)
    return Denoising(found.steps, spec.cache_contexts, spec.timestep_scale, spec.timestep_keys)


class Denoising:
    """The loop of one case's model: its steps and branches, the step in progress (what a cache's timestep callback
    reads) and what each branch of each step computed on this rank."""

    def __init__(self, steps: int, contexts: tuple[str, ...] = ("cond", "uncond"), timestep_scale: float = 1.0,
                 timestep_keys: tuple[str, ...] = ("timestep",)):
        self.steps, self.contexts = steps, contexts
        self.timestep_scale, self.timestep_keys = timestep_scale, timestep_keys
        self.sigmas = [1.0 - (1.0 - LAST_SIGMA) * index / steps for index in range(steps + 1)]
        self.sigma = self.sigmas[0]
        self.work: list[int] = []  # nn.Linear calls per branch of each step on this rank, of the last run
        self.labels = [f"step {index} {context}" for index in range(steps) for context in contexts]
        # a model of its own for each branch, in place of the one run (one device's equivalent of a cache that keeps
        # a state per context: harness.flows.caches.PER_BRANCH); None: every branch runs the one model
        self.branch_models: dict | None = None

    @property
    def guided(self) -> bool:
        return len(self.contexts) > 1

    def current_timestep(self) -> float:
        """The scheduler's timestep of the step in progress: a cache's `current_timestep_callback`."""
        return self.sigma * TIMESTEPS

    def run(self, model, inputs: dict, forward: Callable) -> object:
        """`forward(model, inputs)` for each branch of every step, each inside its `cache_context`, the guided output
        the next latents' Euler step; the last step's guided output. The caches' states are reset at the end, as a
        pipeline's call ends."""
        latents, self.work = inputs["hidden_states"], []
        models = self.branch_models or dict.fromkeys(self.contexts, model)
        with LinearCalls(*dict.fromkeys(models.values())) as counter:
            for index in range(self.steps):
                self.sigma, following = self.sigmas[index], self.sigmas[index + 1]
                where = {"step_index": index, "num_inference_steps": self.steps,
                         "timestep": self.current_timestep(), "sigma": self.sigma}
                outputs = []
                for context in self.contexts:
                    branch = models[context]
                    with branch.cache_context(context, **_taken(branch.cache_context, where)):
                        outputs.append(forward(branch, self._inputs(inputs, latents, context)))
                    self.work.append(counter.take())
                output = self._guided(outputs)
                if output.shape == latents.shape:
                    latents = latents + (following - self.sigma) * output
        for branch in dict.fromkeys(models.values()):  # as a pipeline's call ends (`maybe_free_model_hooks`): the
            if hasattr(branch, "_reset_stateful_cache"):  # next run (a compiled case's measured one) starts afresh
                branch._reset_stateful_cache()
        return output

    def _inputs(self, inputs: dict, latents, context: str) -> dict:
        import torch

        step = {key: torch.full_like(inputs[key], self.sigma * self.timestep_scale) for key in self.timestep_keys
                if isinstance(inputs.get(key), torch.Tensor)}
        negative = {key: -inputs[key] for key in PROMPT_INPUTS
                    if context == "uncond" and isinstance(inputs.get(key), torch.Tensor)}
        return {**inputs, "hidden_states": latents, **step, **negative}

    def _guided(self, outputs: list):
        """The conditional output moved away from the unconditional one by the guidance scale (true CFG)."""
        if not self.guided:
            return outputs[0]
        conditional, unconditional = outputs[0], outputs[1]
        return unconditional + GUIDANCE * (conditional - unconditional)


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


class LinearCalls:
    """Counts the calls of every `nn.Linear` of the models while it is entered."""

    def __init__(self, *models):
        self.models, self.count, self.handles = models, 0, []

    def __enter__(self) -> LinearCalls:
        import torch

        self.handles = [module.register_forward_hook(self._seen) for model in self.models for module in model.modules()
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
