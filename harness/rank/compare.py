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


def training_errors(candidate: dict, losses: torch.Tensor, gradients: dict, weights: dict) -> dict:
    """A training run against another: per-step loss (absolute, relative, bitwise), each parameter's gradient at
    step 1 (max abs, relative L2 norm), all gradients together (relative L2), each parameter's weights after the last
    step (max abs)."""
    ran = candidate["losses"].double()
    loss_abs = (ran - losses.double()).abs()
    per_param, squared_diff, squared_norm, nonfinite = {}, 0.0, 0.0, int((~torch.isfinite(ran)).sum())
    missing = sorted(set(gradients) - set(candidate["gradients"]))
    for name, expected in gradients.items():
        got = candidate["gradients"].get(name)
        if got is None or got.shape != expected.shape:
            continue
        got, expected = got.double(), expected.double()
        nonfinite += int((~torch.isfinite(got)).sum())
        diff = (got - expected).norm().item() ** 2
        norm = expected.norm().item() ** 2
        squared_diff, squared_norm = squared_diff + diff, squared_norm + norm
        per_param[name] = {"rel_l2": (diff ** 0.5) / max(norm ** 0.5, 1e-30),
                           "max_abs": float((got - expected).abs().max()) if got.numel() else 0.0}
    weight_errors = {}
    for name, expected in weights.items():
        got = candidate["weights"].get(name)
        if got is None or got.shape != expected.shape:
            missing.append(f"{name} (weights)")
            continue
        nonfinite += int((~torch.isfinite(got)).sum())
        weight_errors[name] = float((got.double() - expected.double()).abs().max()) if got.numel() else 0.0
    worst = max(per_param, key=lambda name: per_param[name]["rel_l2"], default=None)
    return {
        "loss_abs_err": float(loss_abs.max()),
        "loss_rel_err": float((loss_abs / losses.double().abs().clamp_min(1e-30)).max()),
        "loss_bitwise_equal": bool(torch.equal(candidate["losses"].float(), losses.float())),
        "grad_err": (squared_diff ** 0.5) / max(squared_norm ** 0.5, 1e-30),
        "grad_max_abs_err": max((value["max_abs"] for value in per_param.values()), default=0.0),
        "worst_param": worst,
        "param_errors": per_param,
        "weight_max_abs_err": max(weight_errors.values(), default=0.0),
        "weight_errors": weight_errors,
        "missing": missing,
        "nonfinite": nonfinite,
    }
