"""What diffusers will do with a case, known before anything launches: what it refuses (an expected refusal, XFAIL
when seen: harness.run.verdict) and the loads it cannot take here (a plan-time SKIP). The plan asks; this module
knows diffusers. Torch-free to import: the layout's config is asked of the installed diffusers when a case needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from harness.catalogue.zoo import get_spec
from harness.core.applicability import NotApplicable
from harness.core.errors import first_line
from harness.core.layouts import Layout
from harness.core.records import Case
from harness.loads import load_of

HEADS = ("num_attention_heads", "audio_num_attention_heads")  # the head counts of a spec's config that attention splits


@dataclass(frozen=True)
class Refusal:
    """What the plan predicts diffusers will refuse for a case: why, and the texts its error may contain."""

    reason: str
    error_contains: tuple[str, ...]
    checked: bool = False  # the refusal is what the case tests: it runs without --check-refusals too

    def seen_in(self, message: str) -> bool:
        return any(text in message for text in self.error_contains)


def predicted_refusal(case: Case, split_lengths: Callable[[Case], dict | None],
                      context_parallel_capable: Callable[[str], bool]) -> Refusal | None:
    """What diffusers is expected to refuse: a tensor-parallel combination it guards against (the case's load's
    guard, read from its own code), a tensor-parallel degree that does not divide the heads, a context-parallel
    config its validation refuses, a backend its registry does not list as context-parallel capable
    (`context_parallel_capable`), a head count Ulysses-anything cannot pad, or a sequence (`split_lengths`, the
    case's kind's) or head count that plain ring/Ulysses cannot split evenly."""
    load = load_of(case.load)
    guard = load.guarded_here()
    if guard is not None:
        return Refusal(f"diffusers refuses {guard.what} with tensor parallelism ({load.refused_where})",
                       (guard.error,), checked=True)
    layout, spec = case.layout, get_spec(case.model)
    heads = {key: spec.config[key] for key in HEADS if key in spec.config}
    if layout.tp > 1 and heads.get("num_attention_heads", 0) % layout.tp:
        return Refusal(f"num_attention_heads {heads['num_attention_heads']} not divisible by the tensor-parallel "
                       f"degree {layout.tp}", ("must divide the number of attention heads",))
    if not layout.is_context_parallel:
        return None
    refused = config_refusal(layout)
    if refused is not None:
        return refused
    if not context_parallel_capable(case.backend):
        return Refusal(f"diffusers does not register backend {case.backend!r} as context-parallel capable",
                       ("does not support context parallelism",))
    if layout.anything:
        return unpaddable_heads(heads, layout.ulysses)
    return uneven_split(layout, heads, split_lengths(case))


def uneven_split(layout: Layout, heads: dict[str, int], lengths: dict[str, int] | None) -> Refusal | None:
    """Plain ring/Ulysses split the sequence `lengths` over the context-parallel degree and the heads over the
    Ulysses degree evenly (the *any layouts do not need it); None where they divide, or where the lengths are
    unknown (diffusers decides)."""
    if lengths is None:
        return None
    degree = layout.ring * layout.ulysses
    reasons, texts = [], []
    uneven = [f"{name} {length}" for name, length in lengths.items() if length % degree]
    if uneven:
        reasons.append(f"{', '.join(uneven)} not divisible by the context-parallel degree {degree}")
        texts.append("must be divisible by mesh size")
    uneven_heads = [f"{key} {count}" for key, count in heads.items() if count % layout.ulysses]
    if uneven_heads:  # diffusers' Ulysses all-to-all then fails in a reshape, without a message of its own
        reasons.append(f"{', '.join(uneven_heads)} not divisible by the Ulysses degree {layout.ulysses}")
        texts.append("is invalid for input of size")
    if not reasons:
        return None
    return Refusal("; ".join(reasons) + " (plain ring/Ulysses split evenly; the *any layouts do not need it)",
                   tuple(texts))


def unpaddable_heads(heads: dict[str, int], degree: int) -> Refusal | None:
    """Ulysses-anything pads the heads up to a multiple of the degree, but only by fewer heads than each rank then
    holds (diffusers asserts it: 4 heads over 3 ranks would pad 2 for 2 a rank); the *any layouts take any
    sequence length."""
    for key, count in heads.items():
        pad = (degree - count % degree) % degree
        if pad and pad >= (count + pad) // degree:
            return Refusal(f"{key} {count} over the Ulysses degree {degree}: Ulysses-anything would pad {pad} heads "
                           f"for {(count + pad) // degree} a rank, and pads fewer only",
                           ("should be less than new local head num",))
    return None


@functools.cache
def config_refusal(layout: Layout) -> Refusal | None:
    """The installed diffusers' own refusal of a context-parallel layout's config (`ContextParallelConfig`'s
    validation, asked without a process group), or None when it accepts it. Tensor-parallel combinations are left to
    `enable_parallelism` (their refusal is a known issue of the releases that refuse them)."""
    if layout.tp > 1 or layout.is_torch_context_parallel:
        return None
    try:
        layout.diffusers_config()
    except (ValueError, NotImplementedError) as error:
        message = first_line(error)
        return Refusal(f"diffusers' ContextParallelConfig refuses {layout.name}: {message}", (message,))
    return None


def load_skip(case: Case) -> str | None:
    """Why the case's load cannot run here, or None (harness.loads): N/A for a `--weights` folder (the axis is the
    zoo's), SKIP where a tiny model's plan or a package stands in the way."""
    load = load_of(case.load)
    if load.checkpoint and case.weights_dir is not None:
        return NotApplicable("a --weights checkpoint is loaded as it is; the load axis applies to the zoo's own "
                             "checkpoints")
    spec = get_spec(case.model)
    if load.checkpoint and spec.cp_plan is not None and case.layout.is_context_parallel:
        return (f"from_pretrained takes no cp_plan, and the tiny {spec.class_name}'s own _cp_plan does not fit it "
                f"(the zoo passes enable_parallelism a pruned plan)")
    return load.unavailable()
