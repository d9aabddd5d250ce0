"""Faults only torch.compile can show: a graph break in diffusers' context-parallel attention, and SDPA wrong only
while the compiler traces it."""

from __future__ import annotations

import contextlib

from harness.faults.registry import fault


@fault("torch.compile: a graph break inside diffusers' context-parallel attention (the numbers stay right; a "
       "compiled case counts it, and --fullgraph makes it FAIL)")
@contextlib.contextmanager
def cp_graph_break():
    import torch
    from diffusers.models import attention_dispatch as dispatch

    original = dispatch._templated_context_parallel_attention

    def broken(*args, **kwargs):
        torch._dynamo.graph_break()  # nothing in eager; under torch.compile the graph ends here
        return original(*args, **kwargs)

    dispatch._templated_context_parallel_attention = broken
    try:
        yield
    finally:
        dispatch._templated_context_parallel_attention = original


@fault("torch.compile: SDPA returns 10% larger values only while torch.compile traces it (eager is right, so only "
       "a compiled case can catch it)")
@contextlib.contextmanager
def compiled_only():
    import torch

    original = torch.nn.functional.scaled_dot_product_attention

    def wrong_when_compiled(*args, **kwargs):
        output = original(*args, **kwargs)
        return output * 1.1 if torch.compiler.is_compiling() else output

    torch.nn.functional.scaled_dot_product_attention = wrong_when_compiled
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
