"""What diffusers refuses to combine with tensor parallelism, read from the installed release's own code.

diffusers >= 0.41 checks these in `diffusers.hooks.tensor_parallel._check_tp_supported`: `from_pretrained` checks its
loading options (a `device_map`, a `quantization_config`) before it reads a file, and `enable_parallelism` checks the
model in memory (group offloading, accelerate's placement hooks, LoRA layers) before it shards anything: "rather than
failing deep inside `parallelize_module` — or, worse, sharding successfully and producing wrong numbers" (its
docstring). Each `tp_*` load (harness.core.loads) builds one combination the way a user would; a release whose module
carries the guard's message is expected to refuse it with that message (harness.run.plan: an expected refusal, XFAIL
when seen), and a release without it runs the combination and is judged on its numbers like any case.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

MODULE = "diffusers.hooks.tensor_parallel"


@dataclass(frozen=True)
class Guard:
    load: str  # the `tp_*` load that builds the combination
    what: str  # what is combined with tensor parallelism, for the reason
    error: str  # a text of diffusers' error, which its module's source carries where it guards
    where: str  # the check, for people
    needs: tuple[str, ...] = ()  # importable packages the combination needs on this machine
    why_needed: str = ""


GUARDS = {guard.load: guard for guard in (
    Guard("tp_device_map", "a device_map", "`device_map` cannot be combined with a tensor-parallel",
          "_check_tp_supported, from from_pretrained"),
    Guard("tp_quantized", "a quantization_config", "`quantization_config` cannot be combined with a tensor-parallel",
          "_check_tp_supported, from from_pretrained", ("optimum.quanto",),
          "a quantizer that runs on CPU (optimum-quanto): diffusers validates the quantizer's environment before its "
          "tensor-parallel check"),
    Guard("tp_group_offload", "group offloading", "has group offloading enabled, which cannot be combined with tensor",
          "_check_tp_supported, from enable_parallelism"),
    Guard("tp_cpu_offload", "accelerate's CPU offloading", "is placed by accelerate",
          "_check_tp_supported, from enable_parallelism", ("accelerate",), "accelerate"),
    Guard("tp_lora", "LoRA adapter layers", "has adapter (LoRA) layers injected",
          "_check_tp_supported, from enable_parallelism", ("peft",), "peft (diffusers' LoRA layers)"),
)}


def _source() -> str:
    """The installed tensor-parallel module's source ("" where the release has none)."""
    from harness.core import compat

    return compat.source_of(MODULE)


def guarding(load: str) -> Guard | None:
    """The guard the installed diffusers has against the combination `load` builds, or None (not a combination, or
    a release that does not guard it: then the case is judged on its numbers)."""
    guard = GUARDS.get(load)
    return guard if guard is not None and guard.error in _source() else None


def unavailable(load: str) -> str | None:
    """Why the combination `load` cannot be built on this machine (a plan-time SKIP), or None."""
    guard = GUARDS.get(load)
    if guard is None:
        return None
    missing = [name for name in guard.needs if importlib.util.find_spec(name.split(".")[0]) is None
               or importlib.util.find_spec(name) is None]
    return f"{guard.load} needs {guard.why_needed}, which is not installed" if missing else None
