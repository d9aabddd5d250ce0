"""The `tensor` kind: one forward of a zoo transformer, compared tensor to tensor.

fp32: max abs error against the fp32 reference within the fp32 tolerance. Low precision: within the dtype's fixed
tolerance AND the error budget: the mean abs error may exceed that of the single-device run of the same dtype and
backend by at most `budget_factor`. NaN/Inf never passes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.catalogue.zoo import get_spec
from harness.core import determinism
from harness.core.dtypes import torch_dtype
from harness.core.evidence import Evidence
from harness.core.records import Case
from harness.core.reference import Reference, reference_meta, reference_path, write_reference
from harness.core.results import CaseResult
from harness.kinds.base import Built, Check, Kind, Policy
from harness.rank.compare import abs_err_histogram, tensor_metrics


def run_model(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


class TensorKind(Kind):
    name = "tensor"
    help = "one forward of the transformer"
    checks = {"nonfinite": Check(), "max_abs_err": Check(), "err_ratio": Check(), "max_err_ratio": Check()}
    cost_s = 0.3  # the quick plan's recorded case seconds: 0.22 s on one rank, 0.62 s on four

    def shapes(self, spec, wanted, weights_dir):
        names = list(spec.shapes) if "all" in wanted else [name for name in wanted if name in spec.shapes]
        return [(name, None) for name in names]

    def split_lengths(self, case: Case) -> dict[str, int]:
        return get_spec(case.model).split_lengths(case.shape)

    def reference_hash(self, case: Case) -> str:
        return get_spec(case.model).config_hash()

    def capture(self, model, shape, root, force=False, weights_dir=None) -> tuple[Path, bool]:
        spec = get_spec(model)
        path = reference_path(root, spec.name, shape)
        if path.exists() and not force:
            return path, False
        determinism.strict_fp32()
        module = spec.build().to(torch.float32)
        inputs = spec.inputs(shape)
        output = run_model(module, inputs)
        meta = reference_meta(spec.name, shape, self.name, spec.config, spec.config_hash(),
                              **{"class": spec.class_name, "seed": spec.seed})
        return path, write_reference(path, module.state_dict(), inputs, output, meta, force=force)

    def build(self, case: Case, reference: Reference, device) -> Built:
        """The model from the reference's fp32 weights cast once to the case's dtype (never down and back up)."""
        dtype, spec = torch_dtype(case.dtype), get_spec(case.model)
        model = spec.model_class()(**reference.meta["config"])
        model.load_state_dict(reference.weights)
        model = model.to(device, dtype).eval()
        # `.clone()`: tensors mapped from the file can sit at unaligned addresses, which moves results by ~1e-7.
        inputs = {
            key: value.to(device, dtype if value.is_floating_point() else value.dtype).clone()
            if isinstance(value, torch.Tensor) else value
            for key, value in reference.inputs.items()
        }
        model.set_attention_backend(case.backend)
        return Built(model, lambda: run_model(model, inputs), cp_plan=spec.context_parallel_plan(model.config))

    def detach(self, output):
        return output.float().cpu()

    def measure(self, output, reference, baseline, case, images_dir, draws=None) -> dict:
        output = output.float().cpu()
        metrics = {**tensor_metrics(output, reference.output),
                   "abs_err_hist": abs_err_histogram(output, reference.output)}
        if isinstance(baseline, str):
            metrics["baseline_error"] = baseline
        else:
            metrics["baseline"] = tensor_metrics(baseline, reference.output)
            metrics["vs_baseline_max_abs"] = tensor_metrics(output, baseline)["max_abs_err"]
        return metrics

    def judge(self, result: CaseResult, metrics: dict, policy: Policy) -> list[Evidence]:
        """Every check, each failure an item: finite, within the dtype's tolerance and, in low precision, within
        the error budget of the single-device run of the same dtype, on the mean and on the max."""
        for key in ("max_abs_err", "mean_abs_err", "max_rel_err", "nonfinite"):
            setattr(result, key, metrics[key])
        result.tolerance = policy.tolerance
        result.extra["abs_err_hist"] = metrics.get("abs_err_hist")
        # How far the layout is from the single-device run of the same model: kept on FAIL too, where it tells a
        # changed model (layouts agree, ~1e-7) from a parallel bug.
        result.extra["vs_baseline_max_abs"] = metrics.get("vs_baseline_max_abs")
        found = []
        if result.nonfinite:
            found.append(Evidence("nonfinite", f"output has {result.nonfinite} non-finite values (NaN/Inf)",
                                  value=result.nonfinite, limit=0))
        if not result.max_abs_err <= result.tolerance:
            found.append(Evidence("max_abs_err", f"max abs err {result.max_abs_err:.3g} > tolerance "
                                                 f"{result.tolerance:.3g}", value=result.max_abs_err,
                                  limit=result.tolerance))
        if result.dtype == "fp32":
            return found
        baseline = metrics.get("baseline")
        if baseline is None:  # the budget is what separates a broken bf16 layout: without it there is no verdict
            return [*found, Evidence("cannot_judge", f"cannot judge: the single-device {result.dtype} run failed "
                                                     f"({metrics.get('baseline_error')}), so there is no error budget")]
        result.baseline_err = baseline["mean_abs_err"]
        result.extra["baseline_max_abs_err"] = baseline["max_abs_err"]
        result.err_ratio = _ratio(result.mean_abs_err, result.baseline_err)
        if not result.err_ratio <= policy.budget_factor:
            found.append(Evidence("err_ratio", f"error budget: mean abs err {result.mean_abs_err:.3g} is "
                                               f"{result.err_ratio:.2f}x the single-device {result.dtype} error "
                                               f"{result.baseline_err:.3g} (budget {policy.budget_factor}x)",
                                  value=result.err_ratio, limit=policy.budget_factor))
        # A few wrong values hardly move the mean: the max answers to the dtype's own max too.
        max_ratio = _ratio(result.max_abs_err, baseline["max_abs_err"])
        result.extra["max_err_ratio"] = max_ratio
        if not max_ratio <= policy.budget_max_factor:
            found.append(Evidence("max_err_ratio", f"error budget: max abs err {result.max_abs_err:.3g} is "
                                                   f"{max_ratio:.2f}x the single-device {result.dtype} max "
                                                   f"{baseline['max_abs_err']:.3g} (budget "
                                                   f"{policy.budget_max_factor}x)",
                                  value=max_ratio, limit=policy.budget_max_factor))
        return found


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else (0.0 if value == 0 else float("inf"))
