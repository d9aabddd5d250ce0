"""The `tensor` kind: one forward of a zoo transformer, compared tensor to tensor.

fp32: max abs error against the fp32 reference within the fp32 limit. Low precision: within the dtype's coarse
limit AND the error budget: the mean abs error may exceed that of the single-device run of the same dtype and
backend by at most `budget_factor`, its max that run's max by at most `budget_max_factor`; AND against that
single-device output itself, the max abs difference within `noise_factor` times the largest of its forward noise
draws (harness.rank.noise): a dtype's own error against fp32 can be ten times a real bug's, the noise between a
correct layout and one device a few ulps. NaN/Inf never passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.core.evidence import Evidence
from harness.core.figures import PARITY, SINGLE_DEVICE, FigureSpec, histogram
from harness.core.options import Option
from harness.kinds.base import (
    FLOW_FAMILIES,
    FULL_COMPILE_FAMILIES,
    TORCH_CP_NOT_SCRIPTED,
    Built,
    Check,
    Kind,
    every_model_slice,
    slice_ids,
)
from harness.kinds.capturing import module_record, seeded_meta, seeded_model

MAX_ABS = FigureSpec("max_abs_err", "max abs err", cell="{value:.1e}", short="err")
MEAN_ABS = FigureSpec("mean_abs_err", "mean abs err")
MAX_REL = FigureSpec("max_rel_err", "max rel err")
NONFINITE = FigureSpec("nonfinite", "non-finite values", "d")
BASELINE = FigureSpec("baseline_err", "baseline mean abs err (one device, same dtype)")
# A ratio to one device's own error is 1 where the layout adds none: its budget is what lies above 1
RATIO = FigureSpec("err_ratio", "mean err ratio (vs one device, same dtype)", short="budget", ideal=1.0)
MAX_RATIO = FigureSpec("max_err_ratio", "max err ratio (vs one device, same dtype)", short="max budget", ideal=1.0)
VS_BASELINE = FigureSpec("vs_baseline_max_abs", "max abs diff to one device, same dtype", role=PARITY,
                         short="vs 1-dev")
NOISE = FigureSpec("noise_max_abs", "max abs diff of the noisiest single-device draw, same dtype")
SINGLE_RUN = FigureSpec("single_max_abs_err", "max abs err of the single-device run (same dtype)", role=SINGLE_DEVICE,
                        short="1-dev err")


@dataclass(frozen=True)
class TensorPolicy:
    tolerance: float  # max abs error against the fp32 reference
    budget_factor: float  # low precision: the mean error against the single-device run's
    budget_max_factor: float  # low precision: the max error against the single-device run's max
    noise_factor: float  # low precision: the difference to the single-device run against its noise draws'


def run_model(model, inputs: dict):
    import torch

    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def _forward(model, inputs: dict, loop, flow_inputs=None):
    """One forward, or the denoising loop of a flow that decides per step (a cache: harness.flows.denoising); with
    what the case's flow passes with each call besides (`flow_inputs(model)`: an IP-Adapter's image)."""
    if flow_inputs is not None:
        inputs = {**inputs, **flow_inputs(model)}
    return run_model(model, inputs) if loop is None else loop.run(model, inputs, run_model)


class TensorKind(Kind):
    name = "tensor"
    help = "one forward of the transformer"
    checks = {"nonfinite": Check(), "max_abs_err": Check(), "err_ratio": Check(), "max_err_ratio": Check(),
              "vs_baseline_max_abs": Check()}
    figures = (MAX_ABS, MEAN_ABS, MAX_REL, NONFINITE, BASELINE, RATIO, MAX_RATIO, VS_BASELINE, NOISE, SINGLE_RUN)
    # Correct fp32 layouts measure <= 8.3e-7 on the tiny zoo and the classic broken layout ~1e-2, so fp32 stays tight;
    # low precision is judged by the error budget against its own single-device run besides (docs/judging.md).
    limits = Option("limits", {"fp32": 1e-5, "bf16": 0.15, "fp16": 2e-2},
                    "Max abs error against the fp32 reference, per dtype.", is_table=True)
    options = (Option("noise_factor", 2.0, "Low precision: most the output may differ from the single-device output "
                                           "of its dtype, in multiples of the largest of four noise draws there."),)
    cost_s = 0.3  # the quick plan's recorded case seconds: 0.22 s on one rank, 0.62 s on four
    torch_context_parallel = True  # its run can be wrapped in PyTorch's `context_parallel` (tcp layouts)

    def policy(self, settings, dtype: str) -> TensorPolicy:
        return TensorPolicy(settings.limits(self.name, dtype), settings.budget_factor, settings.budget_max_factor,
                            settings.of(self.name, "noise_factor"))

    def compile_slice(self, plan: str) -> list[str]:
        """quick: flux and qwenimage on one layout of each family it compiles (ring's native backend is a known
        refusal; the full plan compiles ring), fp32, and flux's single and ulysses2 in bf16 (about 4 minutes of Inductor
        cold with the train kind's case, 1 warm, on 2 cores: docs/compile.md), and flux's ulysses2 with the flows that
        declare `quick_compiled` (a LoRA, layerwise casting, a cache: each a proof path of its own compiled). full:
        every model under ulysses2, each layout family on flux and qwenimage, and every flow in both orders on flux's
        ulysses2."""
        if plan == "quick":
            from harness import flows

            ulysses = slice_ids(self.name, ("flux",), (("ulysses2", "native"),))
            return [*slice_ids(self.name, ("flux", "qwenimage"), (("single", "native"), ("ulysses2", "native"),
                                                                   ("tp2", "native"))),
                    *slice_ids(self.name, ("flux",), (("single", "native"), ("ulysses2", "native")), ("bf16",)),
                    *(f"{case}/{value}" for case in ulysses for value in flows.quick_compiled())]
        if plan != "full":
            return []
        from harness.catalogue.zoo import SPECS

        return [*slice_ids(self.name, SPECS, (("ulysses2", "native"),)),
                *slice_ids(self.name, ("flux", "qwenimage"), FULL_COMPILE_FAMILIES),
                *(f"{case}/*" for case in slice_ids(self.name, ("flux",), (("ulysses2", "native"),)))]  # every flow

    def load_slice(self, plan: str) -> list[str]:
        """quick: flux and qwenimage on one layout of each family diffusers loads with a parallel_config, fp32."""
        if plan == "quick":
            return slice_ids(self.name, ("flux", "qwenimage"), (("ulysses2", "native"), ("ring2", "_native_flash"),
                                                                 ("tp2", "native")))
        return super().load_slice(plan)

    def flow_slice(self, plan: str) -> list[str]:
        """quick: flux and qwenimage under ulysses2, ring2 and tp2, fp32. full: every model on each of those
        families (a flow exists on the layouts it declares: harness.flows)."""
        if plan == "quick":
            return slice_ids(self.name, ("flux", "qwenimage"), FLOW_FAMILIES)
        return every_model_slice(self.name, FLOW_FAMILIES) if plan == "full" else []

    def shapes(self, spec, wanted, weights_dir):
        names = list(spec.shapes) if "all" in wanted else [name for name in wanted if name in spec.shapes]
        return [(name, None) for name in names]

    def split_lengths(self, case) -> dict[str, int]:
        from harness.catalogue.zoo import get_spec

        return get_spec(case.model).split_lengths(case.shape)

    def reference_hash(self, case) -> str:
        from harness.catalogue.zoo import get_spec

        return get_spec(case.model).config_hash()

    def capture(self, model, shape, root, force=False, weights_dir=None) -> tuple[Path, bool]:
        from harness.core.reference import write_reference

        spec, path, module = seeded_model(self.name, model, shape, root, force)
        if module is None:
            return path, False
        from harness.rank.fingerprint import Recorder

        inputs = spec.inputs(shape)
        with Recorder(module) as recorder:  # what each module gave: where a later run first leaves it
            output = run_model(module, inputs)
        meta, modules = seeded_meta(spec, shape, self.name, spec.config_hash()), module_record(recorder.finish(output))
        return path, write_reference(path, module.state_dict(), inputs, output, meta, force=force, modules=modules)

    def build(self, case, reference, device, load) -> Built:
        """The model from the reference's fp32 weights cast once to the case's dtype (never down and back up)."""
        import torch

        from harness import flows as flows_
        from harness.catalogue.zoo import get_spec
        from harness.core.dtypes import torch_dtype
        from harness.flows import denoising
        from harness.rank import loading, noise, torch_cp

        dtype, spec = torch_dtype(case.dtype), get_spec(case.model)
        model = loading.transformer(load, spec.model_class(), reference, device, dtype).eval()  # the case's load's way
        # `.clone()`: tensors mapped from the file can sit at unaligned addresses, which moves results by ~1e-7.
        inputs = {
            key: value.to(device, dtype if value.is_floating_point() else value.dtype).clone()
            if isinstance(value, torch.Tensor) else value
            for key, value in reference.inputs.items()
        }
        if not flows_.sets_backend(case.flow):  # else the flow sets it, after enable_parallelism (harness.flows)
            model.set_attention_backend(case.backend)
        buffers = (lambda: torch_cp.buffers_of(inputs, spec.torch_cp_buffers)) if spec.torch_cp_buffers else None
        draw, loop = noise.ForwardDraw(model, reference.weights), denoising.of_flow(case.flow, spec)
        passed = flows_.inputs_of(case.flow, self.name)
        flow_inputs = None if passed is None else (lambda module: passed(module, device, dtype))
        return Built(model, lambda: draw.run(lambda: _forward(model, inputs, loop, flow_inputs)),
                     cp_plan=spec.context_parallel_plan(model.config), twin=draw.twin,
                     torch_cp_buffers=buffers, torch_cp_output_dim=spec.torch_cp_output_dim, denoising=loop)

    def repro_script(self, case) -> str | None:
        return None if case.layout.is_torch_context_parallel else "tensor.py"

    def repro_refusal(self, case) -> str:
        return TORCH_CP_NOT_SCRIPTED

    def detach(self, output):
        return output.float().cpu()

    def measure(self, output, reference, baseline, case, images_dir, draws=None) -> dict:
        from harness.rank.compare import abs_err_histogram, tensor_metrics

        output = output.float().cpu()
        metrics = {**tensor_metrics(output, reference.output),
                   "abs_err_hist": abs_err_histogram(output, reference.output)}
        if isinstance(baseline, str):
            metrics["baseline_error"] = baseline
        else:
            metrics["baseline"] = tensor_metrics(baseline, reference.output)
            metrics["vs_baseline_max_abs"] = tensor_metrics(output, baseline)["max_abs_err"]
            metrics["noise"], metrics["noise_errors"] = {}, {}
            for name, run in (draws or {}).items():
                if isinstance(run, str):
                    metrics["noise_errors"][name] = run
                else:
                    metrics["noise"][name] = tensor_metrics(run, baseline)["max_abs_err"]
        return metrics

    def draws_for(self, case) -> tuple[str, ...]:
        """Low precision is judged against its own single-device output, by the noise of its dtype there."""
        from harness.rank import noise

        return noise.FORWARD_DRAWS if case.dtype != "fp32" else ()

    def judge(self, result, metrics: dict, policy: TensorPolicy) -> list[Evidence]:
        """Every check, each failure an item: finite, within the dtype's tolerance and, in low precision, within
        the error budget of the single-device run of the same dtype, on the mean and on the max."""
        max_abs, nonfinite = metrics["max_abs_err"], metrics["nonfinite"]
        fixed = f"fixed, the {result.dtype} entry of tensor_limits"
        figures = [MAX_ABS.of(max_abs, policy.tolerance, fixed), MEAN_ABS.of(metrics["mean_abs_err"]),
                   MAX_REL.of(metrics["max_rel_err"]), NONFINITE.of(nonfinite)]
        hist = metrics.get("abs_err_hist")
        if hist:
            result.extra["blocks"] = [histogram("Absolute error histogram", hist["edges"], hist["counts"],
                                                policy.tolerance)]
        found = []
        if nonfinite:
            found.append(Evidence("nonfinite", f"output has {nonfinite} non-finite values (NaN/Inf)",
                                  value=nonfinite, limit=0))
        if not max_abs <= policy.tolerance:
            found.append(Evidence("max_abs_err", f"max abs err {max_abs:.3g} > tolerance {policy.tolerance:.3g}",
                                  value=max_abs, limit=policy.tolerance))
        baseline = metrics.get("baseline")
        if result.dtype != "fp32" and baseline is None:  # the budget is what separates a broken bf16 layout
            found.append(Evidence("cannot_judge", f"cannot judge: the single-device {result.dtype} run failed "
                                                  f"({metrics.get('baseline_error')}), so there is no error budget"))
        elif result.dtype != "fp32":
            figures += self._budget(result.dtype, metrics, baseline, policy, found)
            figures += self._against_noise(result.dtype, metrics, policy, found)
        if not any(figure["name"] == VS_BASELINE.name for figure in figures):
            # How far the layout is from the single-device run of the same model: kept on FAIL too, where it tells
            # a changed model (layouts agree, ~1e-7) from a parallel bug.
            figures.append(VS_BASELINE.of(metrics.get("vs_baseline_max_abs")))
        if baseline is not None:  # what a changed model, backend or compiler shows: one device off the reference too
            figures.append(SINGLE_RUN.of(baseline["max_abs_err"], policy.tolerance, fixed))
        result.figures = figures
        return found

    @staticmethod
    def _against_noise(dtype: str, metrics: dict, policy: TensorPolicy, found: list) -> list[dict]:
        """The output against the single-device output of its dtype: within `noise_factor` times the largest
        difference any of that run's noise draws makes. What breaks it goes into `found`."""
        diff = metrics["vs_baseline_max_abs"]
        if metrics.get("noise_errors") or not metrics.get("noise"):
            failed = "; ".join(f"{name}: {error}" for name, error in metrics.get("noise_errors", {}).items())
            found.append(Evidence("cannot_judge", f"cannot judge against the single-device {dtype} output: its noise "
                                                  f"draws failed ({failed or 'none ran'})"))
            return [VS_BASELINE.of(diff)]
        noisiest = max(metrics["noise"].values())
        limit = policy.noise_factor * noisiest
        if not diff <= limit:
            found.append(Evidence("vs_baseline_max_abs",
                                  f"vs single-device {dtype}: max abs diff {diff:.3g} > {policy.noise_factor}x the "
                                  f"largest of its {len(metrics['noise'])} noise draws ({noisiest:.3g})",
                                  value=diff, limit=limit))
        derived = (f"{policy.noise_factor} x the noisiest of its {len(metrics['noise'])} single-device {dtype} draws "
                   f"({noisiest:.3g}; tensor noise_factor)")
        return [VS_BASELINE.of(diff, limit, derived), NOISE.of(noisiest)]

    @staticmethod
    def _budget(dtype: str, metrics: dict, baseline: dict, policy: TensorPolicy, found: list) -> list[dict]:
        """The error budget's figures; what breaks it goes into `found`. A few wrong values hardly move the mean:
        the max answers to the dtype's own max too."""
        ratio = _ratio(metrics["mean_abs_err"], baseline["mean_abs_err"])
        max_ratio = _ratio(metrics["max_abs_err"], baseline["max_abs_err"])
        if not ratio <= policy.budget_factor:
            found.append(Evidence("err_ratio", f"error budget: mean abs err {metrics['mean_abs_err']:.3g} is "
                                               f"{ratio:.2f}x the single-device {dtype} error "
                                               f"{baseline['mean_abs_err']:.3g} (budget {policy.budget_factor}x)",
                                  value=ratio, limit=policy.budget_factor))
        if not max_ratio <= policy.budget_max_factor:
            found.append(Evidence("max_err_ratio", f"error budget: max abs err {metrics['max_abs_err']:.3g} is "
                                                   f"{max_ratio:.2f}x the single-device {dtype} max "
                                                   f"{baseline['max_abs_err']:.3g} (budget "
                                                   f"{policy.budget_max_factor}x)",
                                  value=max_ratio, limit=policy.budget_max_factor))
        return [BASELINE.of(baseline["mean_abs_err"]),
                RATIO.of(ratio, policy.budget_factor, f"budget_factor: the single-device {dtype} mean abs err "
                                                      f"({baseline['mean_abs_err']:.3g}) x {policy.budget_factor}"),
                MAX_RATIO.of(max_ratio, policy.budget_max_factor, f"budget_max_factor: the single-device {dtype} max "
                                                                  f"abs err ({baseline['max_abs_err']:.3g}) x "
                                                                  f"{policy.budget_max_factor}")]

    def rank_tolerance(self, policy: TensorPolicy) -> float:
        return policy.tolerance


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else (0.0 if value == 0 else float("inf"))
