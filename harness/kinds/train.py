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
from pathlib import Path

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
        if case.layout.is_context_parallel:
            return backends.backward_missing(case.backend, case.layout)
        return None

    def shapes(self, spec, wanted, weights_dir):
        if weights_dir is not None:
            return []
        names = list(spec.shapes) if "all" in wanted else [name for name in wanted if name in spec.shapes]
        return [(name, None) for name in names]

    def split_lengths(self, case: Case) -> dict[str, int]:
        return get_spec(case.model).split_lengths(case.shape)

    def reference_hash(self, case: Case) -> str:
        return _recipe_hash(get_spec(case.model).config_hash())

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

        def run() -> dict:
            if "trainer" not in state:  # the single-device baseline runs without a layout
                parallelize(None)
            return {**state["trainer"].run(), "engine": state["engine"]}

        return Built(model, run, cp_plan=spec.context_parallel_plan(model.config), parallelize=parallelize)

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
        result.loss_err, result.grad_err = metrics["loss_rel_err"], metrics["grad_err"]
        result.worst_param, result.nonfinite = metrics["worst_param"], metrics["nonfinite"]
        result.max_abs_err = metrics["weight_max_abs_err"]
        result.tolerance = policy.train_limits["weight_abs"]
        result.extra["train"] = _figures(metrics)
        return Status.PASS, ""

    def cell(self, result: CaseResult) -> str:
        return f" g{result.grad_err:.0e}" if result.grad_err is not None else ""


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
