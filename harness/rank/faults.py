"""Deliberate bugs for negative controls: each must make the harness report FAIL.

A fault is active only inside `active(name)`, for one case, in one worker process.
"""

from __future__ import annotations

import contextlib

import torch

FAULTS = {
    "cp_local_attention": "context parallel: each rank attends only to its own chunk (the classic two half-images bug)",
    "tp_skip_allreduce": "tensor parallel: row-wise layers return their partial sums without the all-reduce",
    "tp_colwise_input_grad": "tensor parallel, backward: column-wise layers hand on their input gradient without the "
                             "all-reduce (each rank's partial sum; the forward is right)",
    "cp_attention_left_out": "context parallel: one attention module is left out of the parallel plan (its processor"
                             " never gets the CP config), so it attends to its own chunk and never communicates",
    "cp_graph_break": "torch.compile: a graph break inside diffusers' context-parallel attention (the numbers stay "
                      "right; a compiled case counts it, and --fullgraph makes it FAIL)",
    "compiled_only": "torch.compile: SDPA returns 10% larger values only while torch.compile traces it (eager is "
                     "right, so only a compiled case can catch it)",
    "ring_skips_exchange": "context parallel: the ring never exchanges K/V; every step reuses the rank's own",
    "redirect_dispatch": "backends: `_native_math` and `native` are silently served by each other",
    "math_runs_flash": "backends: `_native_math` is dispatched but the flash kernel executes",
    "redirect_same_kernel": "backends: the `_native_flash` entry holds `native`'s function, counted as `_native_flash`"
                            " (both run the same flash kernel on CPU)",
    "scaled_softmax": "backends: SDPA runs with a 5% larger softmax scale (subtly wrong numbers)",
    "extra_rounding": "low precision: each rank rounds its output shard to 4 mantissa bits before the gather",
    "rope_sign": "a change to diffusers itself: Flux's RoPE rotates the other way (applies to every run, baseline too)",
    "rank1_diverges": "context parallel: rank 1's final gather returns a slightly different output than rank 0's",
    "bf16_few_tokens": "low precision: in bf16 only, one output value comes back 0.02 off after the final gather",
    "train_skip_cp_reduction": "training: the harness skips summing gradients over the context-parallel ranks",
    "train_double_cp_reduction": "training: the harness sums gradients over the context-parallel ranks twice",
    "train_skip_dp_reduction": "training: the data-parallel engine never reduces the gradients (each rank keeps its "
                               "own half-batch gradient)",
    "cp_backward_local_only": "context parallel: attention's forward is right, its backward uses only the rank's own "
                              "key/value chunk (gradients wrong, every forward check passes)",
    "tcp_own_kv_chunk": "PyTorch's context parallelism: every step of its ring takes the rank's own K/V chunk from "
                        "the gathered buffer (the exchange happens, each rank attends only to its own chunk)",
    "tcp_positions_reversed": "PyTorch's context parallelism: the image position ids go to `context_parallel` in "
                              "reverse token order, so each rank rotates its tokens by other tokens' positions",
    "dp_same_samples": "training: the data-parallel split hands every data-parallel rank the first rank's samples",
    "load_wrong_slice": "loading: the sharded from_pretrained reads the next rank's slice of the first weight it "
                        "shards (each rank holds another rank's shard of it)",
    "load_cp_hooks_dropped": "loading: from_pretrained installs only the tensor-parallel part of its parallel_config, "
                             "as reported upstream for CP x TP configs: the context-parallel hooks are never "
                             "installed and every rank computes the whole sequence",
    "hang_rank1": "reliability: rank 1 never reaches the collective the others wait in",
    "raise_rank1": "reliability: rank 1 raises before the forward while the others wait in a collective",
    "kill_rank1": "reliability: rank 1 is killed (SIGKILL) in the middle of the case",
    "hang_node1": "reliability, several nodes: the last rank of node 1 never reaches the collective (none elsewhere)",
    "kill_agent_node1": "reliability, several nodes: node 1's torchrun agent is killed (SIGKILL) in the middle of the "
                        "case, and its ranks stop (none elsewhere)",
}

# Faults aimed at one module (`name:module.path`), to prove that localization names it: each acts only under a
# layout (it hooks the module when `enable_parallelism` runs), so the single-device runs stay clean.
TARGETED = {
    "scale_output": "the module's output comes back 1% larger",
    "skip_allreduce": "tensor parallel: this row-wise layer returns its partial sum without the all-reduce",
    "local_attention": "context parallel: attention inside this module attends only to the rank's own chunk",
    "wrong_grad": "backward: the module hands on its input gradient 1% too large (its forward is right)",
    "attention_grad": "context parallel, backward: attention inside this module hands on its query, key and value "
                      "gradients 1% too large (its forward is right)",
    "grad_scale": "training: the gradients of this module's own parameters come out 10% too large (every other "
                  "parameter's are right)",
}

# Faults that stand for a change in diffusers itself rather than a parallel bug: the single-device baseline runs
# with them too, so the layouts still agree with each other while all of them disagree with the stored reference.
MODEL_CHANGES = {"rope_sign"}


def check(name: str) -> None:
    base, _, target = name.partition(":")
    if (name not in FAULTS) and not (base in TARGETED and target):
        from harness.core.errors import HarnessError

        raise HarnessError(f"unknown fault {name!r}; valid faults: {', '.join(FAULTS)}, and "
                           f"{', '.join(f'{t}:<module path>' for t in TARGETED)}")


@contextlib.contextmanager
def active(name: str | None):
    if name is None:
        yield
        return
    check(name)
    base, _, target = name.partition(":")
    with (globals()[f"_{base}"](target) if target else globals()[f"_{name}"]()):
        yield


@contextlib.contextmanager
def _on_parallel(target: str, act):
    """Call `act(module)` on the module at `target` right after `enable_parallelism`; undo what it returns after."""
    from diffusers import ModelMixin

    original, undo = ModelMixin.enable_parallelism, []

    def enable(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        undo.append(act(self.get_submodule(target)))
        return result

    ModelMixin.enable_parallelism = enable
    try:
        yield
    finally:
        ModelMixin.enable_parallelism = original
        for handle in undo:
            if handle is not None:
                handle.remove()


def _scale_output(target: str):
    def scaled(_module, _args, output):
        if isinstance(output, torch.Tensor):
            return output * 1.01
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            return (output[0] * 1.01, *output[1:])
        return output

    return _on_parallel(target, lambda module: module.register_forward_hook(scaled))


def _wrong_grad(target: str):
    def larger(_module, grad_input, _grad_output):
        return tuple(None if grad is None else grad * 1.01 for grad in grad_input)

    return _on_parallel(target, lambda module: module.register_full_backward_hook(larger))


@contextlib.contextmanager
def _skip_allreduce(target: str):
    """Only the target layer's output hook returns its partial sum (it is bound when the plan is applied)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import RowwiseParallel

    original = RowwiseParallel.__dict__["_prepare_output_fn"]

    def maybe_partial(output_layouts, use_local_output, mod, outputs, device_mesh):
        if getattr(mod, "_harness_fault_target", False):
            return outputs.to_local() if isinstance(outputs, DTensor) else outputs
        return original.__func__(output_layouts, use_local_output, mod, outputs, device_mesh)

    from diffusers import ModelMixin

    enable = ModelMixin.enable_parallelism

    def marked(self, *args, **kwargs):
        self.get_submodule(target)._harness_fault_target = True
        return enable(self, *args, **kwargs)

    RowwiseParallel._prepare_output_fn = staticmethod(maybe_partial)
    ModelMixin.enable_parallelism = marked
    try:
        yield
    finally:
        RowwiseParallel._prepare_output_fn = original
        ModelMixin.enable_parallelism = enable


def _local_attention(target: str):
    """While the target module runs, context-parallel attention sees only the rank's own chunk."""
    def local(_original, query, key, value, attn_mask=None, *args, **kwargs):
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        found = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                                 scale=kwargs.get("scale"))
        return found.permute(0, 2, 1, 3)

    return _inside_attention(target, local)


@contextlib.contextmanager
def _inside_attention(target: str, replacement):
    """While the target module runs, diffusers' context-parallel attention is `replacement(original, *args,
    **kwargs)`; everywhere else it is itself."""
    from diffusers.models import attention_dispatch as dispatch

    original, inside = dispatch._templated_context_parallel_attention, []

    def maybe_replaced(*args, **kwargs):
        return replacement(original, *args, **kwargs) if inside else original(*args, **kwargs)

    class Hooks:
        def __init__(self, module):
            self.handles = [module.register_forward_pre_hook(lambda *_: inside.append(1) and None),
                            module.register_forward_hook(lambda *_: inside.pop() and None)]  # None: output kept

        def remove(self):
            for handle in self.handles:
                handle.remove()

    dispatch._templated_context_parallel_attention = maybe_replaced
    try:
        with _on_parallel(target, Hooks):
            yield
    finally:
        dispatch._templated_context_parallel_attention = original


def _attention_grad(target: str):
    """While the target module runs, context-parallel attention returns its right output with 1.01 times its
    gradient."""
    def larger(right):
        return right + 0.01 * (right - right.detach())

    return _inside_attention(target, lambda original, *args, **kwargs: larger(original(*args, **kwargs)))


@contextlib.contextmanager
def _grad_scale(target: str):
    """After the gradients are reduced (each step), the target module's parameters' gradients are 1.1 times theirs."""
    from harness.rank import training

    original = training.reduce_context_parallel

    def scaled(named, groups):
        original(named, groups)
        with torch.no_grad():
            for name, parameter in named.items():
                if name.startswith(target + ".") and parameter.grad is not None:
                    parameter.grad.mul_(1.1)

    training.reduce_context_parallel = scaled
    try:
        yield
    finally:
        training.reduce_context_parallel = original


@contextlib.contextmanager
def _tp_colwise_input_grad():
    """Column-wise layers take their replicated input through a function whose backward hands on the rank's own
    partial input gradient, where PyTorch's `from_local` all-reduces it (the Partial placement to Replicate)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel

    class LocalInputGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, local, mesh, placements):
            return DTensor.from_local(local, mesh, placements, run_check=False)

        @staticmethod
        def backward(ctx, grad):
            return (grad.to_local() if isinstance(grad, DTensor) else grad), None, None

    original = ColwiseParallel.__dict__["_prepare_input_fn"]

    def unreduced(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
        given = inputs[0]
        if not isinstance(given, DTensor) and tuple(input_layouts) == tuple(desired_input_layouts):
            return LocalInputGrad.apply(given, device_mesh, input_layouts)
        return original.__func__(input_layouts, desired_input_layouts, mod, inputs, device_mesh)

    ColwiseParallel._prepare_input_fn = staticmethod(unreduced)
    try:
        yield
    finally:
        ColwiseParallel._prepare_input_fn = original


@contextlib.contextmanager
def _cp_local_attention():
    from diffusers.models import attention_dispatch as dispatch

    original = dispatch._templated_context_parallel_attention

    def local_only(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, *, forward_op, backward_op, _parallel_config=None):
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        return out.permute(0, 2, 1, 3)

    dispatch._templated_context_parallel_attention = local_only
    try:
        yield
    finally:
        dispatch._templated_context_parallel_attention = original


@contextlib.contextmanager
def _cp_graph_break():
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


@contextlib.contextmanager
def _tp_skip_allreduce():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import RowwiseParallel

    original = RowwiseParallel.__dict__["_prepare_output_fn"]  # the staticmethod object itself, to restore as-is

    def partial_sums(output_layouts, use_local_output, mod, outputs, device_mesh):
        local = outputs.to_local() if isinstance(outputs, DTensor) else outputs
        return local

    RowwiseParallel._prepare_output_fn = staticmethod(partial_sums)
    try:
        yield
    finally:
        RowwiseParallel._prepare_output_fn = original


@contextlib.contextmanager
def _cp_attention_left_out():
    # `enable_parallelism` hands every attention processor the CP config; here the first attention module keeps a
    # processor without it, as a module the plan forgot would: its attention runs locally on the rank's chunk.
    import copy

    from diffusers import ModelMixin

    from harness.catalogue.attention import attention_classes

    original = ModelMixin.enable_parallelism

    def enable_parallelism(self, *args, **kwargs):
        original(self, *args, **kwargs)
        module = next(m for m in self.modules() if isinstance(m, attention_classes()))
        module.processor = copy.copy(module.processor)
        module.processor._parallel_config = None

    ModelMixin.enable_parallelism = enable_parallelism
    try:
        yield
    finally:
        ModelMixin.enable_parallelism = original


class _NoKVExchange:
    """diffusers' `funcol` as the attention dispatcher sees it, except that an all-gather (the ring's K/V exchange)
    returns the rank's own buffer once per ring rank."""

    def __init__(self, funcol):
        self._funcol = funcol

    def __getattr__(self, name):
        return getattr(self._funcol, name)

    @staticmethod
    def all_gather_tensor(tensor, gather_dim, group):
        import torch.distributed as dist

        return torch.cat([tensor] * dist.get_world_size(group), dim=gather_dim)


@contextlib.contextmanager
def _ring_skips_exchange():
    from diffusers.models import attention_dispatch as dispatch

    original = dispatch.funcol
    dispatch.funcol = _NoKVExchange(original)
    try:
        yield
    finally:
        dispatch.funcol = original


@contextlib.contextmanager
def _registry_entry(name: str, replacement):
    """Swap one backend function in diffusers' registry (the dispatcher looks it up on every call)."""
    from harness.rank.backends import registry

    table = registry()._backends
    key = next(key for key in table if getattr(key, "value", key) == name)
    original = table[key]
    table[key] = replacement
    try:
        yield
    finally:
        table[key] = original


@contextlib.contextmanager
def registry_rewritten(name: str, holder: str):
    """A registration mistake as diffusers would make it at import: backend `name` holds `holder`'s function, for
    everything that reads the registry meanwhile (a plan included). Not a per-case fault: what it breaks is decided
    before any case runs."""
    with _registry_entry(name, _backend_fn(holder)):
        yield


def _backend_fn(name: str):
    from harness.rank.backends import registry

    return next(fn for key, fn in registry()._backends.items() if getattr(key, "value", key) == name)


@contextlib.contextmanager
def _redirect_dispatch():
    # diffusers silently serving `_native_math` (or `native`) with another backend: counted as that other one.
    native, math = _backend_fn("native"), _backend_fn("_native_math")
    with _registry_entry("_native_math", native), _registry_entry("native", math):
        yield


@contextlib.contextmanager
def _redirect_same_kernel():
    # The name counts right and the kernel is right (on CPU `native` also runs the flash kernel): only the identity
    # of the function that ran shows that `_native_flash` was not what ran.
    from harness.rank.backends import _counted

    native = _backend_fn("native")
    with _registry_entry("_native_flash", _counted("_native_flash", getattr(native, "__wrapped__", native))):
        yield


@contextlib.contextmanager
def _math_runs_flash():
    # The registry says `_native_math` ran (its counter ticks), but PyTorch executes the flash kernel beneath it.
    from diffusers.models import attention_dispatch as dispatch

    from harness.rank.backends import _counted

    with _registry_entry("_native_math", _counted("_native_math", dispatch._native_flash_attention)):
        yield


@contextlib.contextmanager
def _scaled_softmax():
    # Every native SDPA call uses a 5% larger softmax scale: the right backend and kernel, subtly wrong numbers.
    original = torch.nn.functional.scaled_dot_product_attention

    def scaled(query, key, value, *args, scale=None, **kwargs):
        base = scale if scale is not None else query.shape[-1] ** -0.5
        return original(query, key, value, *args, scale=base * 1.05, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = scaled
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


@contextlib.contextmanager
def _compiled_only():
    original = torch.nn.functional.scaled_dot_product_attention

    def wrong_when_compiled(*args, **kwargs):
        output = original(*args, **kwargs)
        return output * 1.1 if torch.compiler.is_compiling() else output

    torch.nn.functional.scaled_dot_product_attention = wrong_when_compiled
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


@contextlib.contextmanager
def _rope_sign():
    from diffusers.models.transformers import transformer_flux

    original = transformer_flux.apply_rotary_emb

    def flipped(x, freqs_cis, *args, **kwargs):
        cos, sin = freqs_cis
        return original(x, (cos, -sin), *args, **kwargs)

    transformer_flux.apply_rotary_emb = flipped
    try:
        yield
    finally:
        transformer_flux.apply_rotary_emb = original


def _on_rank1(action):
    import torch.distributed as dist

    @contextlib.contextmanager
    def context():
        if dist.is_initialized() and dist.get_rank() == 1:
            action()
        yield

    return context


def _sleep_forever():
    import time

    time.sleep(3600)


def _raise():
    raise RuntimeError("deliberate failure on rank 1 (raise_rank1)")


def _sigkill_self():
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _on_node1(action, local_rank: int):
    """`action` on one rank of node 1 (its local rank `local_rank`, -1 for the last); a no-op on one host."""
    import os

    from harness.core.records import NODE_ENV

    @contextlib.contextmanager
    def context():
        local, count = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        if os.environ.get(NODE_ENV) == "1" and local == local_rank % count:
            action()
        yield

    return context


def _sigkill_agent():
    """Kill this node's torchrun (which started this rank), then wait, as a node whose agent died does no more
    work: the case cannot finish before the node's harness agent has seen it."""
    import os
    import signal

    os.kill(os.getppid(), signal.SIGKILL)
    _sleep_forever()


_hang_rank1 = _on_rank1(_sleep_forever)
_raise_rank1 = _on_rank1(_raise)
_kill_rank1 = _on_rank1(_sigkill_self)
_hang_node1 = _on_node1(_sleep_forever, -1)
_kill_agent_node1 = _on_node1(_sigkill_agent, 0)


@contextlib.contextmanager
def _around_gather(before=None, after=None):
    """diffusers' context-parallel gather (`EquipartitionSharder.unshard`) with a change to each rank's shard before
    it, or to the gathered output after it: where a layout's own bugs live."""
    from diffusers.hooks.context_parallel import EquipartitionSharder

    original = EquipartitionSharder.__dict__["unshard"]

    def unshard(cls, tensor, dim, mesh):
        gathered = original.__func__(cls, before(tensor) if before else tensor, dim, mesh)
        return after(gathered) if after else gathered

    EquipartitionSharder.unshard = classmethod(unshard)
    try:
        yield
    finally:
        EquipartitionSharder.unshard = original


def _extra_rounding():
    # Each rank rounds its output shard once more (to 4 mantissa bits) before the gather: a quiet precision loss
    # of the size a sloppy cast in a layout causes, below the fixed bf16 tolerance but above the error budget.
    def rounded(tensor):
        return _round_mantissa(tensor.float(), bits=4).to(tensor.dtype) if tensor.is_floating_point() else tensor

    return _around_gather(before=rounded)


def _rank1_diverges():
    # Rank 0's output is right; rank 1 ends with one value off by 1e-2 after the last gather. Comparing rank 0's
    # output alone cannot see it.
    import torch.distributed as dist

    return _around_gather(after=lambda out: _nudged(out, 1e-2) if dist.get_rank() == 1 else out)


def _bf16_few_tokens():
    # A wrong value in bf16 only: the mean error hardly moves (the mean budget passes), the fixed 0.15 tolerance
    # passes; only the max against the single-device bf16 max can see it.
    return _around_gather(after=lambda out: _nudged(out, 0.02) if out.dtype == torch.bfloat16 else out)


def _nudged(tensor: torch.Tensor, by: float) -> torch.Tensor:
    """A copy with its first value moved by `by` (integer tensors are left alone)."""
    if not tensor.is_floating_point():
        return tensor
    tensor = tensor.clone()
    tensor.view(-1)[0] += by
    return tensor


def _round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round to `bits` mantissa bits (bf16 keeps 7 of its own, so this is an extra rounding step)."""
    mantissa, exponent = torch.frexp(x)
    scale = 2.0 ** (bits + 1)
    return torch.ldexp(torch.round(mantissa * scale) / scale, exponent)


@contextlib.contextmanager
def _train_skip_cp_reduction():
    from harness.rank import training

    original = training.reduce_context_parallel
    training.reduce_context_parallel = lambda named, groups: None
    try:
        yield
    finally:
        training.reduce_context_parallel = original


@contextlib.contextmanager
def _train_double_cp_reduction():
    from harness.rank import training

    original = training.reduce_context_parallel

    def twice(named, groups):
        original(named, groups)
        original(named, groups)

    training.reduce_context_parallel = twice
    try:
        yield
    finally:
        training.reduce_context_parallel = original


@contextlib.contextmanager
def _train_skip_dp_reduction():
    from harness.rank import training

    original = training.data_parallel_sync

    @contextlib.contextmanager
    def no_sync(model):
        if hasattr(model, "no_sync"):  # DDP
            with model.no_sync():
                yield
        elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2: the reduce-scatter is skipped
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        else:
            yield

    training.data_parallel_sync = no_sync
    try:
        yield
    finally:
        training.data_parallel_sync = original


@contextlib.contextmanager
def _cp_backward_local_only():
    from diffusers.models import attention_dispatch as dispatch

    original = dispatch._templated_context_parallel_attention

    def local_backward(query, key, value, *args, **kwargs):
        right = original(query, key, value, *args, **kwargs)
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        local = torch.nn.functional.scaled_dot_product_attention(q, k, v).permute(0, 2, 1, 3)
        return local + (right - local).detach()  # the forward's numbers, the local attention's gradient

    dispatch._templated_context_parallel_attention = local_backward
    try:
        yield
    finally:
        dispatch._templated_context_parallel_attention = original


@contextlib.contextmanager
def _tcp_own_kv_chunk():
    import torch.distributed as dist
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    original = ring._AllGatherRotater.next_buffer

    def own_chunk(self):
        original(self)  # waits for the all-gather, as the right step does
        return self._aggregated_buffer.chunk(dist.get_world_size(self._pg))[dist.get_rank(self._pg)]

    ring._AllGatherRotater.next_buffer = own_chunk
    try:
        yield
    finally:
        ring._AllGatherRotater.next_buffer = original


@contextlib.contextmanager
def _dp_same_samples():
    from harness.rank import training

    original = training.Batch.part
    training.Batch.part = lambda self, index, parts: original(self, 0, parts)
    try:
        yield
    finally:
        training.Batch.part = original


@contextlib.contextmanager
def _tcp_positions_reversed():
    from harness.rank import torch_cp

    original = torch_cp.sharded

    @contextlib.contextmanager
    def reversed_ids(layout, mesh, buffers):
        flipped = [(tensor, dim) for name, (tensor, dim) in buffers.items() if name == "img_ids"]
        for tensor, dim in flipped:
            tensor.copy_(tensor.flip(dim))
        try:
            with original(layout, mesh, buffers):
                yield
        finally:
            for tensor, dim in flipped:  # the run's inputs as they were (context_parallel restores the flipped ones)
                tensor.copy_(tensor.flip(dim))

    torch_cp.sharded = reversed_ids
    try:
        yield
    finally:
        torch_cp.sharded = original


# --- loading (harness.rank.loading, issue 34) ------------------------------------------------------------------------


@contextlib.contextmanager
def _load_wrong_slice():
    """diffusers' streaming tensor-parallel loader slices each planned weight with `_local_shard` (looked up at each
    call): its first call of a load gets the next rank's slice."""
    from diffusers.hooks import tensor_parallel

    original, calls = tensor_parallel._local_shard, []

    class _NextRank:
        def __init__(self, mesh):
            self.mesh = mesh

        def get_local_rank(self):
            return (self.mesh.get_local_rank() + 1) % self.mesh.size()

        def size(self):
            return self.mesh.size()

    def local_shard(tensor, dim, block_sizes, tp_mesh):
        calls.append(dim)
        return original(tensor, dim, block_sizes, _NextRank(tp_mesh) if len(calls) == 1 else tp_mesh)

    tensor_parallel._local_shard = local_shard
    try:
        yield
    finally:
        tensor_parallel._local_shard = original


@contextlib.contextmanager
def _load_cp_hooks_dropped():
    """`enable_parallelism`, which from_pretrained calls with its parallel_config, resolves the config (mesh and
    all) and applies only its tensor-parallel part, as the upstream report says from_pretrained does with a CP x TP
    config: no context-parallel hook, no processor that knows the config."""
    from diffusers import ModelMixin

    original = ModelMixin.enable_parallelism

    def tensor_parallel_only(self, *, config, cp_plan=None):
        resolve = getattr(self, "_resolve_parallel_config", None)  # 0.41+; before, the config stays unresolved
        resolved = resolve(config) if resolve is not None else config
        if getattr(resolved, "tensor_parallel_config", None) is not None:
            from diffusers.hooks.tensor_parallel import apply_tensor_parallel

            apply_tensor_parallel(self, resolved.tensor_parallel_config, self._tp_plan)

    ModelMixin.enable_parallelism = tensor_parallel_only
    try:
        yield
    finally:
        ModelMixin.enable_parallelism = original
