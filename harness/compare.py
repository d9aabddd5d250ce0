"""Tensor metrics: how far a candidate output is from the reference, and whether it is finite at all."""

from __future__ import annotations

import torch


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
