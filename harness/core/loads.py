"""How a case's model gets its weights and its parallelism: the `load` axis (harness.core.axes), declared here once.

`enable` is how diffusers' own tests drive parallelism: build the model, load the reference's weights, then
`enable_parallelism(config=...)`. The `pretrained` loads are how its distributed-inference guide tells users to:
`<Class>.from_pretrained(folder, parallel_config=..., torch_dtype=...)` from a checkpoint folder (sharded safetensors
with an index, written once per run: harness.run.checkpoints), where a tensor-parallel config makes diffusers >= 0.41
read each rank's own slice straight from the files. The `tp_*` loads are the combinations diffusers guards tensor
parallelism against (harness.catalogue.tp_guards): refused with its own error where the installed release guards
them, judged on their numbers where it does not.

Torch-free: the plan checks the names and asks `applies`; the rank loads by them (harness.rank.loading).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core import axes

ENABLE = "enable"


@dataclass(frozen=True)
class Load:
    name: str
    help: str
    checkpoint: bool = False  # the model comes from the run's checkpoint folder through `from_pretrained`
    wrapped: bool = False  # the layout's config passed inside a `ParallelConfig` (not the bare CP/TP config)
    tensor_parallel_only: bool = False  # exists on tensor-parallel layouts only (a `tp_*` guard's combination)

    def applies(self, layout) -> bool:
        """Whether a case of this load exists on `layout` at all: a combination with tensor parallelism on its
        layouts; a wrapped config where diffusers takes one (elsewhere it loads as `pretrained` does)."""
        if self.tensor_parallel_only:
            return layout.tp > 1
        return layout.is_context_parallel or layout.tp > 1 if self.wrapped else True


LOADS = {load.name: load for load in (
    Load(ENABLE, "the model built, the reference's weights loaded, then enable_parallelism(config=...) (how "
                 "diffusers' own tests drive it)"),
    Load("pretrained", "<Class>.from_pretrained(folder, parallel_config=<the layout's config>, torch_dtype=...) from "
                       "a sharded safetensors checkpoint saved once per run (how diffusers' guide tells users to)",
         checkpoint=True),
    Load("pretrained_wrapped", "as pretrained, the layout's config inside a ParallelConfig(context_parallel_config="
                               "..., tensor_parallel_config=...) (the spelling from_pretrained loads context "
                               "parallelism with on diffusers 0.41-0.42)", checkpoint=True, wrapped=True),
    Load("tp_device_map", "from_pretrained(folder, parallel_config=<TP>, device_map='cpu'|'cuda')",
         checkpoint=True, tensor_parallel_only=True),
    Load("tp_quantized", "from_pretrained(folder, parallel_config=<TP>, quantization_config=<a CPU quantizer>)",
         checkpoint=True, tensor_parallel_only=True),
    Load("tp_group_offload", "the model group-offloaded (enable_group_offload), then enable_parallelism(<TP>)",
         tensor_parallel_only=True),
    Load("tp_cpu_offload", "the model placed by accelerate's cpu_offload, then enable_parallelism(<TP>)",
         tensor_parallel_only=True),
    Load("tp_lora", "a LoRA adapter added (add_adapter), then enable_parallelism(<TP>)", tensor_parallel_only=True),
)}


def load_of(name: str) -> Load:
    from harness.core.errors import HarnessError

    if name not in LOADS:
        raise HarnessError(f"unknown load {name!r}; valid loads: {', '.join(LOADS)}")
    return LOADS[name]


def enable_id(case_id: str) -> tuple[str, str]:
    """A case id without its load (a mode and a negative control's fault stay), and the load: the id of the case's
    `enable` twin."""
    values = axes.parse(case_id)
    return axes.spell({**values, "load": ENABLE}, values["fault"]), values["load"]
