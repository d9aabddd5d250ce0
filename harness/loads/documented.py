"""The loads diffusers documents: `enable` as its own tests drive parallelism (build the model, load the reference's
weights, then `enable_parallelism(config=...)`), and `from_pretrained(folder, parallel_config=..., torch_dtype=...)`
as its distributed-inference guide tells users to, from a checkpoint folder (sharded safetensors with an index,
written once per run: harness.run.checkpoints), where a tensor-parallel config makes diffusers >= 0.41 read each
rank's own slice straight from the files."""

from __future__ import annotations

from harness.loads.registry import checkpoint_load, memory_load


@memory_load("the model built, the reference's weights loaded, then enable_parallelism(config=...) (how diffusers' own "
             "tests drive it)")
def enable(model, device) -> None:
    """Nothing beyond the build: the layout's `enable_parallelism` follows."""


@checkpoint_load("<Class>.from_pretrained(folder, parallel_config=<the layout's config>, torch_dtype=...) from a "
                 "sharded safetensors checkpoint saved once per run (how diffusers' guide tells users to)")
def pretrained() -> dict:
    return {}


@checkpoint_load("as pretrained, the layout's config inside a ParallelConfig(context_parallel_config=..., "
                 "tensor_parallel_config=...) (the spelling from_pretrained loads context parallelism with on "
                 "diffusers 0.41-0.42)", wrapped=True)
def pretrained_wrapped() -> dict:
    return {}
