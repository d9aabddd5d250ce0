"""Faults aimed at one module (`name:module.path`), to prove that localization names it. Each acts only under a
layout (it hooks the module when `enable_parallelism` runs), so the single-device runs stay clean; but the `shared_`
ones, changes to diffusers itself that every device shares (`model_change`: the single-device runs have them too),
which the module fingerprints of the references locate (harness.engine.drift)."""

from __future__ import annotations

import contextlib

from harness.faults.patching import patched
from harness.faults.registry import fault


@contextlib.contextmanager
def _on_parallel(target: str, act):
    """Call `act(module)` on the module at `target` right after `enable_parallelism`; undo what it returns after."""
    from diffusers import ModelMixin

    original = ModelMixin.enable_parallelism
    with contextlib.ExitStack() as undo:
        def enable(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            handle = act(self.get_submodule(target))
            if handle is not None:
                undo.callback(handle.remove)
            return result

        with patched(ModelMixin, "enable_parallelism", enable):
            yield


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

    with patched(dispatch, "_templated_context_parallel_attention", maybe_replaced), _on_parallel(target, Hooks):
        yield


@fault("the module's output comes back 1% larger", targeted=True)
def scale_output(target: str):
    import torch

    def scaled(_module, _args, output):
        if isinstance(output, torch.Tensor):
            return output * 1.01
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            return (output[0] * 1.01, *output[1:])
        return output

    return _on_parallel(target, lambda module: module.register_forward_hook(scaled))


@fault("tensor parallel: this row-wise layer returns its partial sum without the all-reduce", targeted=True)
@contextlib.contextmanager
def skip_allreduce(target: str):
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

    with (patched(RowwiseParallel, "_prepare_output_fn", staticmethod(maybe_partial)),
          patched(ModelMixin, "enable_parallelism", marked)):
        yield


@fault("context parallel: attention inside this module attends only to the rank's own chunk", targeted=True)
def local_attention(target: str):
    """While the target module runs, context-parallel attention sees only the rank's own chunk."""
    import torch

    def local(_original, query, key, value, attn_mask=None, *args, **kwargs):
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        found = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                                 scale=kwargs.get("scale"))
        return found.permute(0, 2, 1, 3)

    return _inside_attention(target, local)


@fault("backward: the module hands on its input gradient 1% too large (its forward is right)", targeted=True)
def wrong_grad(target: str):
    def larger(_module, grad_input, _grad_output):
        return tuple(None if grad is None else grad * 1.01 for grad in grad_input)

    return _on_parallel(target, lambda module: module.register_full_backward_hook(larger))


@fault("context parallel, backward: attention inside this module hands on its query, key and value gradients 1% too "
       "large (its forward is right)", targeted=True)
def attention_grad(target: str):
    """While the target module runs, context-parallel attention returns its right output with 1.01 times its
    gradient."""
    def larger(right):
        return right + 0.01 * (right - right.detach())

    return _inside_attention(target, lambda original, *args, **kwargs: larger(original(*args, **kwargs)))


@fault("training: the gradients of this module's own parameters come out 10% too large (every other parameter's are "
       "right)", targeted=True)
def grad_scale(target: str):
    """After the gradients are reduced (each step), the target module's parameters' gradients are 1.1 times theirs."""
    import torch

    from harness.rank import training

    original = training.reduce_context_parallel

    def scaled(named, groups):
        original(named, groups)
        with torch.no_grad():
            for name, parameter in named.items():
                if name.startswith(target + ".") and parameter.grad is not None:
                    parameter.grad.mul_(1.1)

    return patched(training, "reduce_context_parallel", scaled)



@fault("repeat determinism: on rank 1 this module's output moves by another small amount at every call (a state "
       "carried from one run to the next), so the case does not repeat itself bit for bit", targeted=True)
def nondeterministic(target: str):
    """Rank 1's module output times 1 + k 2^-20, k one more at each call (1 to 64): below fp32's limits, and never
    the same twice in a row, as a stale buffer or an unordered reduction makes a run differ from the one before."""
    import torch.distributed as dist

    calls = []

    def drifting(_module, _args, output):
        if not dist.is_initialized() or dist.get_rank() != 1:
            return output
        calls.append(1)
        factor = 1 + (1 + len(calls) % 64) * 2.0**-20
        return (output[0] * factor, *output[1:]) if isinstance(output, tuple) else output * factor

    return _on_parallel(target, lambda module: module.register_forward_hook(drifting))


# How much the shared changes below move their module: far below fp32's limits (the output moves by ~1e-6, inside the
# layouts' tolerance of 1e-5), far above one device's rerun noise on its platform (none: bit for bit).
SHARED_CHANGE = 2.0**-20


@contextlib.contextmanager
def _on_every_model(target: str, act):
    """`act(module)` on the module at `target` of every diffusers model as it is first called, on one device and
    under every layout alike (a change to diffusers that every device shares); undone after the block."""
    from diffusers import ModelMixin

    original, undo, seen = ModelMixin.__call__, [], set()

    def called(self, *args, **kwargs):
        if id(self) not in seen:
            seen.add(id(self))
            try:
                undo.append(act(self.get_submodule(target)))
            except AttributeError:  # another model of the pipeline (a VAE): not the one changed
                pass
        return original(self, *args, **kwargs)

    try:
        with patched(ModelMixin, "__call__", called):
            yield
    finally:
        for handle in undo:
            handle.remove()


@fault("a change to diffusers itself: this module's output is 1 + 2^-20 times its own, on every device (inside fp32's "
       "limits, beyond one device's rerun noise)", targeted=True, model_change=True)
def shared_scale(target: str):
    def scaled(_module, _args, output):
        if isinstance(output, tuple):
            return (output[0] * (1 + SHARED_CHANGE), *output[1:])
        return output * (1 + SHARED_CHANGE)

    # first of the module's hooks: its output is what any later hook (a trace) sees, as if its own code computed it
    return _on_every_model(target, lambda module: module.register_forward_hook(scaled, prepend=True))


@fault("a change to diffusers itself, backward only: this module hands on its input gradient 1 + 2^-20 times its own, "
       "on every device (its forward is right)", targeted=True, model_change=True)
def shared_grad(target: str):
    def larger(_module, grad_input, _grad_output):
        return tuple(None if grad is None else grad * (1 + SHARED_CHANGE) for grad in grad_input)

    return _on_every_model(target, lambda module: module.register_full_backward_hook(larger, prepend=True))
