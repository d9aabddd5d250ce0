"""Tensor metrics: how far a candidate output is from the reference, and whether it is finite at all."""

from __future__ import annotations

import torch


def abs_err_histogram(candidate: torch.Tensor, reference: torch.Tensor) -> dict[str, list]:
    """Counts of |candidate - reference| in decades from 1e-10 to 10 (exact zeros in the first bin): the shape of
    the error, for the report; a correct layout sits at rounding level, a broken one spreads decades higher."""
    diff = (candidate.detach().double().cpu() - reference.detach().double().cpu()).abs().flatten()
    diff = diff[torch.isfinite(diff)].clamp(min=1e-10, max=10.0)
    edges = [10.0**power for power in range(-10, 2)]
    counts = torch.histogram(diff.log10(), bins=torch.arange(-10.0, 2.0, dtype=torch.float64)).hist
    return {"edges": edges, "counts": [int(count) for count in counts]}


def tensor_metrics(candidate: torch.Tensor, reference: torch.Tensor) -> dict[str, float | int]:
    """Max/mean absolute error, max relative error and the count of non-finite values, all in fp64."""
    if candidate.shape != reference.shape:
        raise ValueError(f"output shape {tuple(candidate.shape)} != reference shape {tuple(reference.shape)}")
    candidate, reference = candidate.detach().double().cpu(), reference.detach().double().cpu()
    nonfinite = int((~torch.isfinite(candidate)).sum())
    diff = (candidate - reference).abs()
    scale = reference.abs().max().clamp_min(1e-12)
    return {
        "max_abs_err": float(diff.max()),
        "mean_abs_err": float(diff.mean()),
        "max_rel_err": float(diff.max() / scale),
        "nonfinite": nonfinite,
    }
