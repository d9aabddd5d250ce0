"""Other draws of a low precision's rounding noise on one device: how much an error figure moves between runs that
differ only in noise, which is what the limits of low-precision training cases are made of.

Each draw is the single-device run of the same dtype from the same fp32 weights and batch, with one thing changed
that rounds differently and computes the same in exact arithmetic:
- `nudged:<seed>`: every weight multiplied by 1 + u, u uniform in [-2^-20, 2^-20]: far below what bf16 (2^-8) or
  fp16 (2^-11) resolve and far below any fp32 limit, so it moves only which way some values round;
- `microbatch`: the batch as one sample at a time, the gradients accumulated (what data parallelism does to the
  reductions of the weight gradients);
- `math_kernel`: SDPA's math kernel in place of the one PyTorch picks (another attention kernel, as another backend
  or a ring's merged chunks compute it).
- `split_reduction`: every linear layer's reduction computed in two halves, each rounded to the dtype, then summed
  (what a row-wise tensor-parallel layer and its all-reduce compute).
Measured on the full plan (docs/training.md): one draw alone moves a figure by up to 2.6x the first
run's (the loss, which is noise-dominated), and a correct layout stays within 2.4x of the first run; the largest of
the five is the noise a layout may not exceed by more than `budget_max_factor`. A low-precision forward (the tensor
and image kinds) is judged against its own single-device output by the largest of the forward draws
(docs/judging.md).
"""

from __future__ import annotations

import contextlib

import torch

RELATIVE = 2.0**-20
DRAWS = ("nudged:1", "nudged:2", "microbatch", "math_kernel")  # a training loop's
FORWARD_DRAWS = ("nudged:1", "nudged:2", "math_kernel", "split_reduction")  # one forward's (tensor, image)


def perturb(module: torch.nn.Module, seed: int) -> None:
    """Multiply every floating-point parameter of `module` in place by 1 + u, u ~ U(-RELATIVE, RELATIVE), drawn on the
    CPU from `seed` (the same draw on every machine)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            if not parameter.is_floating_point():
                continue
            noise = (torch.rand(parameter.shape, generator=generator, dtype=torch.float64) * 2 - 1) * RELATIVE
            parameter.mul_((1 + noise).to(parameter.device, parameter.dtype))


def nudged_weights(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """fp32 `weights` (a reference's), each floating-point tensor multiplied by 1 + u as `perturb` does: loaded into a
    low-precision module, they move which way some weights round (a bf16 module's own weights cannot be nudged)."""
    generator = torch.Generator().manual_seed(seed)
    nudged = {}
    for name, tensor in weights.items():
        if tensor.is_floating_point():
            noise = (torch.rand(tensor.shape, generator=generator, dtype=torch.float64) * 2 - 1) * RELATIVE
            tensor = (tensor.double() * (1 + noise)).to(tensor.dtype)
        nudged[name] = tensor
    return nudged


def math_kernel():
    """SDPA's math kernel in place of the one PyTorch picks."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


@contextlib.contextmanager
def split_reduction():
    """Every `nn.Linear` as a row-wise tensor-parallel layer of degree 2 computes it: two partial products over the
    halves of its input features, each rounded to the dtype, summed."""
    original = torch.nn.Linear.forward

    def halves(self, x):
        half = x.shape[-1] // 2
        first = torch.nn.functional.linear(x[..., :half], self.weight[:, :half])
        return first + torch.nn.functional.linear(x[..., half:], self.weight[:, half:], self.bias)

    torch.nn.Linear.forward = halves
    try:
        yield
    finally:
        torch.nn.Linear.forward = original


class ForwardDraw:
    """A single-device forward (a model's, or a pipeline's around it) made into another draw of its dtype's noise:
    `twin(draw)` picks the draw, `run(fn)` runs `fn` under it. `weights` are the module's fp32 weights to nudge
    (None: a checkpoint loaded in its dtype, whose nudged draws then equal the first run)."""

    def __init__(self, module: torch.nn.Module, weights: dict[str, torch.Tensor] | None):
        self.module, self.weights, self.context = module, weights, contextlib.nullcontext

    def twin(self, draw: str) -> None:
        name, _, seed = draw.partition(":")
        if name == "nudged":
            if self.weights is not None:
                self.module.load_state_dict(nudged_weights(self.weights, int(seed)))
        elif name == "math_kernel":
            self.context = math_kernel
        elif name == "split_reduction":
            self.context = split_reduction
        else:
            raise ValueError(f"unknown noise draw {draw!r}; known: {', '.join(FORWARD_DRAWS)}")

    def run(self, fn):
        with self.context():
            return fn()
