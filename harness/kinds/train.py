"""The `train` kind: K AdamW steps of flow-matching training from the reference's weights (the seed checkpoint),
compared step by step: the loss of every step, every parameter's gradient at step 1, the weights after step K.

The reference is the fp32 single-device run. Under a layout the harness trains as a correct training loop does
(harness.rank.training): the global batch split over the data-parallel ranks, gradients summed over the
context-parallel ranks and averaged over the data-parallel ones, tensor-parallel DTensors gathered to full. fp32 is
judged by tight tolerances; low precision (mixed precision: fp32 weights, autocast forward) by the error budget
against the single-device run of the same dtype, as tensors are.
"""

from __future__ import annotations

import hashlib
import json

import torch

from harness.catalogue.zoo import get_spec
from harness.core import determinism
from harness.core.dtypes import torch_dtype
from harness.core.records import Case
from harness.core.reference import Reference, reference_meta, reference_path, write_reference
from harness.core.results import CaseResult, Status
from harness.kinds.base import Built, Kind, Policy
from harness.rank import backends, training
from harness.rank.compare import training_errors

DEFAULT_STEPS = 3
TRAINED_SHAPES = ("default", "masked")
_GRAD, _FINAL = "grad.", "final."


class TrainKind(Kind):
    name = "train"
    help = "a few AdamW steps of flow-matching training: losses, gradients and weights"

    def applies(self, layout) -> bool:
        return True

    def skip_reason(self, case: Case) -> str | None:
        spec = get_spec(case.model)
        if spec.untrainable:
            return f"no training recipe for {spec.name}: {spec.untrainable}"
        return backends.backward_missing(case.backend, case.layout, case.dtype)

    def shapes(self, spec, wanted, weights_dir):
        """The default shape and the padded-prompt one (a mask that must follow the tokens through backward too).
        The odd-length shapes test the forward's split: plain ring/Ulysses refuse them and the *any layouts, which
        take them, have no backward."""
        if weights_dir is not None:
            return []
        names = [name for name in TRAINED_SHAPES if name in spec.shapes and ("all" in wanted or name in wanted)]
        return [(name, None) for name in names]

    def split_lengths(self, case: Case) -> dict[str, int]:
        return get_spec(case.model).split_lengths(case.shape)

    def reference_hash(self, case: Case) -> str:
        return _recipe_hash(get_spec(case.model).config_hash())

    def captures(self, spec) -> bool:
        return spec.untrainable is None

    def capture_options(self, settings) -> dict:
        return {"steps": settings.train_steps}

    def stale(self, meta: dict, settings) -> str | None:
        steps = meta.get("train", {}).get("steps")
        if steps != settings.train_steps:
            return (f"holds {steps} training steps where --train-steps asks for {settings.train_steps}: recapture "
                    f"it with `harness capture --models {meta.get('model')} --kinds train --shapes "
                    f"{meta.get('shape')} --train-steps {settings.train_steps} --force`")
        return None

    def capture(self, model, shape, root, force=False, weights_dir=None, steps: int = DEFAULT_STEPS):
        """The fp32 single-device run: its losses, gradients at step 1 and weights after the last step, with the
        seed weights and the whole batch (latents, conditions, every step's noise and sigmas)."""
        spec = get_spec(model)
        path = reference_path(root, spec.name, shape, self.name)
        if path.exists() and not force:
            return path, False
        determinism.strict_fp32()
        module = spec.build().to(torch.float32)
        seed_weights = {name: value.clone() for name, value in module.state_dict().items()}
        batch = training.make_batch(spec, shape, steps)
        trainer = training.Trainer(module, module, batch, steps, spec, None, torch.device("cpu"), training.Groups())
        ran = trainer.run()
        extras = {"noise": batch.noise, "sigmas": batch.sigmas,
                  **{_GRAD + name: value for name, value in ran["gradients"].items()},
                  **{_FINAL + name: value for name, value in ran["weights"].items()}}
        meta = reference_meta(spec.name, shape, self.name, spec.config, _recipe_hash(spec.config_hash()),
                              **{"class": spec.class_name, "seed": spec.seed,
                                 "train": {"steps": steps, "recipe": training.RECIPE, "batched": list(batch.batched)}})
        inputs = {**batch.conditions, "hidden_states": batch.latents}
        return path, write_reference(path, seed_weights, inputs, ran["losses"], meta, force=force, extras=extras)

    def build(self, case: Case, reference: Reference, device) -> Built:
        spec = get_spec(case.model)
        model = spec.model_class()(**reference.meta["config"])
        model.load_state_dict(reference.weights)
        model = model.to(device, torch.float32)
        model.set_attention_backend(case.backend)
        batch = _batch(reference)
        steps = reference.meta["train"]["steps"]
        dtype = None if case.dtype == "fp32" else torch_dtype(case.dtype)
        state: dict = {}

        def parallelize(mesh) -> None:
            """After diffusers' own `enable_parallelism`: the data-parallel engine, and this rank's samples."""
            groups = training.Groups.of(case.layout, mesh)
            wrapped, engine, part = model, None, batch
            if groups.data is not None:
                engine = training.data_parallel_engine()
                wrapped = training.wrap_data_parallel(model, mesh, engine)
                part = batch.part(torch.distributed.get_rank(groups.data), groups.data_size)
            packed = training.packed_parameters(model, case.layout.tp) if mesh is not None and case.layout.tp > 1 \
                else {}
            state["trainer"] = training.Trainer(wrapped, model, part.to(device), steps, spec, dtype, device, groups,
                                                packed)
            state["engine"] = engine

        def recorded(recording=None) -> dict:
            """K steps; the proof's recording covers step 1's forward and backward (the optimizer is not diffusers')."""
            if "trainer" not in state:  # the single-device baseline runs without a layout
                parallelize(None)
            return {**state["trainer"].run(recording), "engine": state["engine"]}

        def forward() -> torch.Tensor:
            if "trainer" not in state:
                parallelize(None)
            return state["trainer"].first_forward()

        return Built(model, recorded, cp_plan=spec.context_parallel_plan(model.config), parallelize=parallelize,
                     recorded=recorded, forward=forward, loss=forward)

    def detach(self, output):
        return output

    def comparable(self, output) -> torch.Tensor:
        """Everything a rank ends with, in one vector: every rank of a correct loop holds the same."""
        parts = [output["losses"].float()] + [output[key][name].flatten() for key in ("gradients", "weights")
                                              for name in sorted(output[key])]
        return torch.cat(parts).contiguous()

    def measure(self, output, reference, baseline, case, images_dir) -> dict:
        expected = _expected(reference)
        metrics = training_errors(output, *expected)
        metrics.update(losses=output["losses"].tolist(), reference_losses=reference.output.tolist(),
                       engine=output.get("engine"), disagreement=output.get("disagreement", {}))
        if isinstance(baseline, str):
            metrics["baseline_error"] = baseline
        else:
            baseline_errors = training_errors(baseline, *expected)
            metrics["baseline"] = {key: value for key, value in baseline_errors.items() if key != "param_errors"}
            metrics["baseline_losses"] = baseline["losses"].tolist()
            metrics["baseline_param_errors"] = {name: value["rel_l2"]
                                                for name, value in baseline_errors["param_errors"].items()}
        return metrics

    def judge(self, result: CaseResult, metrics: dict, policy: Policy) -> tuple[Status, str]:
        """fp32: every figure within its limit (and bitwise-equal losses with `exact`). Low precision: the loss, all
        gradients together, and each parameter's gradient within the budget of the single-device run of the same
        dtype, above the dtype's noise floor (the weights after a few AdamW steps are noise in low precision: its
        first steps move every weight by about the learning rate, whatever the sign noise). Always: no NaN/Inf, a
        gradient for every parameter, and ranks that agree bit for bit on every plain parameter."""
        limits = policy.train_limits
        result.loss_err, result.grad_err = metrics["loss_rel_err"], metrics["grad_err"]
        result.worst_param, result.nonfinite = metrics["worst_param"], metrics["nonfinite"]
        result.max_abs_err, result.tolerance = metrics["weight_max_abs_err"], limits["grad_rel"]
        result.extra["train"] = _figures(metrics)
        if result.nonfinite:
            return Status.FAIL, f"training produced {result.nonfinite} non-finite values (NaN/Inf)"
        if metrics["missing"]:
            return Status.FAIL, f"no gradient for {_names(metrics['missing'])}"
        if metrics["disagreement"]:
            spread = metrics["disagreement"]
            return Status.FAIL, (f"the ranks disagree on the plain parameter(s) {_names(spread, spread)}: each rank "
                                 f"trains its own copy")
        if result.dtype == "fp32":
            return self._judge_fp32(metrics, limits, policy.exact)
        baseline = metrics.get("baseline")
        if baseline is None:
            return Status.ERROR, (f"cannot judge: the single-device {result.dtype} training failed "
                                  f"({metrics.get('baseline_error')}), so there is no error budget")
        result.baseline_err = baseline["grad_err"]
        result.err_ratio = _ratio(result.grad_err, baseline["grad_err"])
        broken = []
        if result.err_ratio > policy.budget_factor:
            broken.append(f"gradients: rel L2 err {result.grad_err:.3g} is {result.err_ratio:.2f}x the single-device "
                          f"{result.dtype} {baseline['grad_err']:.3g} (budget {policy.budget_factor}x)")
        if metrics["loss_rel_err"] > max(policy.budget_max_factor * baseline["loss_rel_err"], limits["loss_rel"]):
            broken.append(f"loss: rel err {metrics['loss_rel_err']:.3g} > {policy.budget_max_factor}x the "
                          f"single-device {result.dtype} {baseline['loss_rel_err']:.3g} "
                          f"(floor {limits['loss_rel']:.3g})")
        own = metrics.get("baseline_param_errors", {})
        wrong = {name: value["rel_l2"] for name, value in metrics["param_errors"].items()
                 if value["rel_l2"] > max(policy.budget_max_factor * own.get(name, 0.0), limits["grad_rel"])}
        if wrong:
            broken.append(f"gradient of {_names(wrong, wrong)} (rel L2 err) beyond {policy.budget_max_factor}x the "
                          f"single-device {result.dtype} and the floor {limits['grad_rel']:.3g}")
        return (Status.FAIL, "; ".join(broken)) if broken else (Status.PASS, "")

    @staticmethod
    def _judge_fp32(metrics: dict, limits: dict, exact: bool) -> tuple[Status, str]:
        broken = []
        if exact and not metrics["loss_bitwise_equal"]:
            broken.append(f"losses not bitwise equal to the reference (exact; max abs diff "
                          f"{metrics['loss_abs_err']:.3g})")
        if metrics["loss_rel_err"] > limits["loss_rel"]:
            broken.append(f"loss: rel err {metrics['loss_rel_err']:.3g} > {limits['loss_rel']:.3g}")
        wrong = {name: value["rel_l2"] for name, value in metrics["param_errors"].items()
                 if value["rel_l2"] > limits["grad_rel"]}
        if wrong:
            broken.append(f"gradient of {_names(wrong, wrong)} (rel L2 err) > {limits['grad_rel']:.3g}")
        if metrics["weight_max_abs_err"] > limits["weight_abs"]:
            broken.append(f"weights after the last step: max abs err {metrics['weight_max_abs_err']:.3g} > "
                          f"{limits['weight_abs']:.3g}")
        return (Status.FAIL, "; ".join(broken)) if broken else (Status.PASS, "")

    def rank_tolerance(self, result: CaseResult) -> float:
        """A correct training loop leaves every rank with the same numbers, bit for bit (all-reduced gradients,
        gathered DTensors): any difference is a bug."""
        return 0.0

    def cell(self, result: CaseResult) -> str:
        return f" g{result.grad_err:.0e}" if result.grad_err is not None else ""


def _names(names, values: dict | None = None, most: int = 3) -> str:
    """The first few names, worst first when `values` are given, with how many more."""
    ordered = sorted(names, key=lambda name: -values[name]) if values else list(names)
    shown = ", ".join(f"{name} ({values[name]:.3g})" if values else name for name in ordered[:most])
    return shown + (f" and {len(ordered) - most} more" if len(ordered) > most else "")


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else (0.0 if value == 0 else float("inf"))


def _recipe_hash(config_hash: str) -> str:
    """The spec's config hash and the training recipe: a reference trained another way is stale."""
    payload = json.dumps({"config": config_hash, "recipe": training.RECIPE}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _batch(reference: Reference) -> training.Batch:
    conditions = {key: value for key, value in reference.inputs.items() if key != "hidden_states"}
    return training.Batch(conditions, tuple(reference.meta["train"]["batched"]), reference.inputs["hidden_states"],
                          reference.extras["noise"], reference.extras["sigmas"])


def _expected(reference: Reference) -> tuple:
    gradients = {key[len(_GRAD):]: value for key, value in reference.extras.items() if key.startswith(_GRAD)}
    weights = {key[len(_FINAL):]: value for key, value in reference.extras.items() if key.startswith(_FINAL)}
    return reference.output, gradients, weights


def _figures(metrics: dict) -> dict:
    """What the report shows of a train case: the loss curves, the ten worst gradients, and the other figures."""
    worst = sorted(metrics["param_errors"].items(), key=lambda item: -item[1]["rel_l2"])[:10]
    baseline = metrics.get("baseline_param_errors", {})
    return {
        "losses": metrics["losses"], "reference_losses": metrics["reference_losses"],
        "baseline_losses": metrics.get("baseline_losses"),
        "worst_gradients": [{"param": name, "rel_l2": value["rel_l2"], "max_abs": value["max_abs"],
                             "baseline_rel_l2": baseline.get(name)} for name, value in worst],
        **{key: metrics.get(key) for key in ("loss_abs_err", "loss_bitwise_equal", "grad_max_abs_err",
                                             "weight_max_abs_err", "engine", "disagreement", "missing")},
        "baseline": metrics.get("baseline"),
    }
