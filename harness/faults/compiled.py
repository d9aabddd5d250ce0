"""Faults only torch.compile can show: a graph break in diffusers' context-parallel attention, and SDPA wrong only
while the compiler traces it."""

from __future__ import annotations

from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("torch.compile: a graph break inside diffusers' context-parallel attention (the numbers stay right; a "
       "compiled case counts it, and --fullgraph makes it FAIL)")
def cp_graph_break():
    import torch
    from diffusers.models import attention_dispatch as dispatch

    original = dispatch._templated_context_parallel_attention

    def broken(*args, **kwargs):
        torch._dynamo.graph_break()  # nothing in eager; under torch.compile the graph ends here
        return original(*args, **kwargs)

    return patched(dispatch, "_templated_context_parallel_attention", broken)


@fault("torch.compile: SDPA returns 10% larger values only while torch.compile traces it (eager is right, so only "
       "a compiled case can catch it)")
def compiled_only():
    import torch

    original = torch.nn.functional.scaled_dot_product_attention

    def wrong_when_compiled(*args, **kwargs):
        output = original(*args, **kwargs)
        return output * 1.1 if torch.compiler.is_compiling() else output

    return patched(torch.nn.functional, "scaled_dot_product_attention", wrong_when_compiled)
