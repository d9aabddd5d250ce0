"""What diffusers refuses to combine with tensor parallelism, read from the installed release's own code.

diffusers >= 0.41 checks these in `diffusers.hooks.tensor_parallel._check_tp_supported`: `from_pretrained` checks its
loading options (a `device_map`, a `quantization_config`) before it reads a file, and `enable_parallelism` checks the
model in memory (group offloading, accelerate's placement hooks, LoRA layers) before it shards anything: "rather than
failing deep inside `parallelize_module` — or, worse, sharding successfully and producing wrong numbers" (its
docstring). Each `tp_*` load (harness.loads.tp_combinations) declares its guard; a release whose module carries the
guard's message is expected to refuse it with that message (harness.catalogue.predictions: an expected refusal, XFAIL
when seen), and a release without it runs the combination and is judged on its numbers like any case.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

MODULE = "diffusers.hooks.tensor_parallel"
CHECK = "_check_tp_supported"  # the function of MODULE that refuses, for people


@dataclass(frozen=True)
class Guard:
    what: str  # what is combined with tensor parallelism, for the reason
    error: str  # a text of diffusers' error, which its module's source carries where it guards
    needs: tuple[str, ...] = ()  # importable packages the combination needs on this machine
    why_needed: str = ""

    def in_force(self) -> bool:
        """Whether the installed release guards it (its module's source carries the error's text)."""
        return self.error in _source()

    def missing(self) -> str | None:
        """What of `needs` this machine lacks, said as `why_needed`; None when all is installed."""
        absent = [name for name in self.needs if importlib.util.find_spec(name.split(".")[0]) is None
                  or importlib.util.find_spec(name) is None]
        return self.why_needed if absent else None


def _source() -> str:
    """The installed tensor-parallel module's source ("" where the release has none)."""
    from harness.core import compat

    return compat.source_of(MODULE)
