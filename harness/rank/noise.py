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
Measured on the full plan (docs/training.md): one draw alone moves a figure by up to 2.6x the first
run's (the loss, which is noise-dominated), and a correct layout stays within 2.4x of the first run; the largest of
the five is the noise a layout may not exceed by more than `budget_max_factor`.
"""

from __future__ import annotations

import torch

RELATIVE = 2.0**-20
DRAWS = ("nudged:1", "nudged:2", "microbatch", "math_kernel")


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
