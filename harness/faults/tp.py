"""Tensor-parallel faults: PyTorch's row-wise and column-wise styles without the all-reduce they owe, forward or
backward."""

from __future__ import annotations

from harness.faults.patching import patched
from harness.faults.registry import fault


@fault("tensor parallel: row-wise layers return their partial sums without the all-reduce")
def tp_skip_allreduce():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import RowwiseParallel

    def partial_sums(output_layouts, use_local_output, mod, outputs, device_mesh):
        local = outputs.to_local() if isinstance(outputs, DTensor) else outputs
        return local

    return patched(RowwiseParallel, "_prepare_output_fn", staticmethod(partial_sums))


@fault("tensor parallel, backward: column-wise layers hand on their input gradient without the all-reduce (each "
       "rank's partial sum; the forward is right)")
def tp_colwise_input_grad():
    """Column-wise layers take their replicated input through a function whose backward hands on the rank's own
    partial input gradient, where PyTorch's `from_local` all-reduces it (the Partial placement to Replicate)."""
    import torch
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

    return patched(ColwiseParallel, "_prepare_input_fn", staticmethod(unreduced))
