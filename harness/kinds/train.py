"""The `train` kind: K AdamW steps of flow-matching training from the reference's weights (the seed checkpoint),
compared step by step: the loss of every step, every parameter's gradient at step 1, the weights after step K.

The reference is the fp32 single-device run. Under a layout the harness trains as a correct training loop does
(harness.rank.training): the global batch split over the data-parallel ranks, gradients summed over the
context-parallel ranks and averaged over the data-parallel ones, tensor-parallel DTensors gathered to full. fp32 is
judged by tight limits; low precision (mixed precision: fp32 weights, autocast forward) by the noise its dtype makes
on one device, measured in the same run (harness.rank.noise).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, replace

from harness.core.evidence import Evidence, per_subject
from harness.core.figures import SINGLE_DEVICE, FigureSpec, margin, series, table
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

TRAINED_SHAPES = ("default", "masked")
_GRAD, _FINAL = "grad.", "final."
SINGLE = "single"  # the single-device run of the case's dtype, the first of its noise draws

GRAD = FigureSpec("grad_err", "gradient rel L2 err (all parameters, step 1)", cell="g{value:.0e}", short="grad")
LOSS = FigureSpec("loss_err", "loss rel err (worst step)", short="loss")
WORST = FigureSpec("worst_param", "worst gradient", "")
# The parameter whose gradient used most of its limit: what decides a case that one wrong parameter fails
WORST_GRAD = FigureSpec("worst_grad_err", "gradient rel L2 err of the parameter nearest its limit", short="worst grad")
WEIGHTS = FigureSpec("weight_max_abs_err", "weights max abs err (after the last step)", short="weights")
NONFINITE = FigureSpec("nonfinite", "non-finite values", "d")
NOISE = FigureSpec("baseline_err", "gradient rel L2 err of the noisiest single-device draw")
RATIO = FigureSpec("err_ratio", "gradient err ratio (vs that noise)", short="budget", ideal=1.0)
# What a `single` case of the same model, shape, backend and dtype would show as its key figure, measured in this
# case's launch: `harness ab` tells a changed model from it where the plan trains on no single layout.
SINGLE_RUN = FigureSpec("single_grad_err", "gradient rel L2 err of the single-device run (same dtype)",
                        role=SINGLE_DEVICE, short="1-dev grad")
STEPS = Option("steps", 3, "Optimizer steps a train case runs (and its reference holds).")


@dataclass(frozen=True)
class TrainPolicy:
    limits: dict | None  # fp32: loss_rel, grad_rel (each parameter), weight_abs
    exact: bool  # fp32: losses bitwise equal to the reference's
    noise_factor: float  # low precision: each gradient and the loss against the dtype's measured noise
    budget_factor: float  # low precision: all gradients together against that noise


class TrainKind(Kind):
    name = "train"
    help = "a few AdamW steps of flow-matching training: losses, gradients and weights"
    checks = {"nonfinite": Check(), "missing_grad": Check("parameters", figure=False),
              "ranks_disagree": Check("parameters (or loss)"), "loss_exact": Check(), "loss_rel": Check(),
              "grad_rel": Check("parameters"), "weight_abs": Check("parameters"), "grad_err_ratio": Check()}
    figures = (GRAD, LOSS, WORST, WEIGHTS, NONFINITE, NOISE, RATIO, SINGLE_RUN)
    torch_context_parallel = True  # the whole loop runs under `context_parallel` (tcp layouts, as torchtitan trains)
    reruns = False  # a run trains the model's weights
    options = (
        Option("models", None, "Models the train kind runs (default: those of --models).", is_list=True),
        Option("layouts", None, "Layouts the train kind runs, dpN and dpNx<cp> included (default: those of "
                                "--layouts).", is_list=True),
        Option("shapes", None, "Shapes the train kind runs (default: those of --shapes).", is_list=True),
        STEPS,
        Option("exact", False, "fp32 train cases must reproduce the reference's losses bit for bit, as torchtitan's "
                               "loss comparison demands of deterministic runs."),
        Option("noise_factor", 2.0, "Low precision: most each gradient and the loss may be of the largest error of "
                                    "five single-device draws of their dtype's noise."),
    )
    # fp32, from clean layouts of the full plan (3 AdamW steps): loss rel err <= 2.1e-7, each parameter's gradient
    # rel L2 err <= 1.3e-5, weights <= 1.4e-4 (helios_amplify's dp2: AdamW turns the noise of a near-zero gradient
    # into a step of up to the learning rate); a ring4 backward that sends gradients the wrong way measures loss
    # 3e-4, gradients 1.0, weights 6e-3. Low precision has no fixed limit: its dtype's noise, measured in every run.
    limits = Option("limits", {"fp32": {"loss_rel": 1e-5, "grad_rel": 1e-4, "weight_abs": 1e-3}},
                    "fp32: loss rel err, each gradient's rel L2 err and the weights' max abs err after the last step.",
                    is_table=True)
    # The quick plan trains two models on every family of parallel training once (tcp2: PyTorch's own context
    # parallelism, flux trains in 0.7 s on two ranks); the full plan trains what its models, layouts and shapes are.
    presets = {"quick": {"models": ["flux", "qwenimage"], "shapes": ["default"],
                         "layouts": ["ulysses2", "ring2", "ring4", "ring2xulysses2", "tp2", "dp2", "dp2xulysses2",
                                     "tcp2"]}}

    def policy(self, settings, dtype: str) -> TrainPolicy:
        return TrainPolicy(settings.limits(self.name, dtype), settings.of(self.name, "exact"),
                           settings.of(self.name, "noise_factor"), settings.budget_factor)

    def applies(self, layout) -> bool:
        return True

    def compile_slice(self, plan: str) -> list[str]:
        """quick: flux under ulysses2. full: every model under ulysses2, and flux on each layout family and dp2."""
        if plan == "quick":
            return slice_ids(self.name, ("flux",), (("ulysses2", "native"),))
        if plan != "full":
            return []
        from harness.catalogue.zoo import SPECS

        return [*slice_ids(self.name, SPECS, (("ulysses2", "native"),)),
                *slice_ids(self.name, ("flux",), (*FULL_COMPILE_FAMILIES, ("dp2", "native")))]

    def load_slice(self, plan: str) -> list[str]:
        """quick: flux trained from a tensor-parallel from_pretrained load (the streaming loader's shards)."""
        return slice_ids(self.name, ("flux",), (("tp2", "native"),)) if plan == "quick" else super().load_slice(plan)

    def flow_slice(self, plan: str) -> list[str]:
        """quick: flux trained under ulysses2 and tp2, each with its flows (an adapter added: harness.flows). full:
        every model on each flow family."""
        if plan == "quick":
            return slice_ids(self.name, ("flux",), (("ulysses2", "native"), ("tp2", "native")))
        return every_model_slice(self.name, FLOW_FAMILIES) if plan == "full" else []

    def repro_script(self, case) -> str | None:
        layout = case.layout
        return None if layout.is_data_parallel or layout.tp > 1 or layout.is_torch_context_parallel else "train.py"

    def repro_refusal(self, case) -> str:
        if case.layout.is_torch_context_parallel:
            return TORCH_CP_NOT_SCRIPTED
        return ("a train case under tensor or data parallelism is not scripted (the harness gathers DTensors and runs "
                "FSDP for it); context-parallel layouts are")

    def skip_reason(self, case) -> str | None:
        from harness.catalogue.zoo import get_spec
        from harness.rank import backends

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

    def split_lengths(self, case) -> dict[str, int]:
        from harness.catalogue.zoo import get_spec

        return get_spec(case.model).split_lengths(case.shape)

    def reference_hash(self, case) -> str:
        from harness.catalogue.zoo import get_spec

        return _recipe_hash(get_spec(case.model).config_hash())

    def captures(self, spec) -> bool:
        return spec.untrainable is None

    def capture_options(self, settings) -> dict:
        return {"steps": settings.of(self.name, "steps")}

    def stale(self, meta: dict, settings) -> str | None:
        steps, asked = meta.get("train", {}).get("steps"), settings.of(self.name, "steps")
        if steps != asked:
            return (f"holds {steps} training steps where --train-steps asks for {asked}: recapture it with `harness "
                    f"capture --models {meta.get('model')} --kinds train --shapes {meta.get('shape')} --train-steps "
                    f"{asked} --force`")
        return None

    def capture(self, model, shape, root, force=False, weights_dir=None, steps: int = STEPS.default):
        """The fp32 single-device run: its losses, gradients at step 1 and weights after the last step, with the
        seed weights and the whole batch (latents, conditions, every step's noise and sigmas)."""
        import torch

        from harness.core.reference import write_reference
        from harness.rank import fingerprint, training

        spec, path, module = seeded_model(self.name, model, shape, root, force)
        if module is None:
            return path, False
        seed_weights = {name: value.clone() for name, value in module.state_dict().items()}
        batch = training.make_batch(spec, shape, steps)
        trainer = training.Trainer(module, module, batch, steps, spec, None, torch.device("cpu"), training.Groups())
        ran = trainer.run()
        # step 1 once more, its modules both ways (not in the run itself: backward hooks reorder its accumulations)
        found, _ = fingerprint.record(module, trainer.first_forward, trainer.first_forward)
        extras = {"noise": batch.noise, "sigmas": batch.sigmas,
                  **{_GRAD + name: value for name, value in ran["gradients"].items()},
                  **{_FINAL + name: value for name, value in ran["weights"].items()}}
        meta = seeded_meta(spec, shape, self.name, _recipe_hash(spec.config_hash()),
                           train={"steps": steps, "recipe": training.RECIPE, "batched": list(batch.batched)})
        inputs = {**batch.conditions, "hidden_states": batch.latents}
        # The weights after K AdamW steps reproduce within 9e-6 between two captures (AdamW turns the noise of a
        # near-zero gradient into a step of up to the learning rate): a recapture within 1e-4 keeps the file.
        modules = module_record(found)
        return path, write_reference(path, seed_weights, inputs, ran["losses"], meta, force=force, extras=extras,
                                     loose={_FINAL: 1e-4}, modules=modules)

    def build(self, case, reference, device, load) -> Built:
        import torch

        from harness.catalogue.zoo import get_spec
        from harness.core.dtypes import torch_dtype
        from harness.rank import loading, noise, training

        spec = get_spec(case.model)
        model = loading.transformer(load, spec.model_class(), reference, device, torch.float32)  # the case's load's way
        model.set_attention_backend(case.backend)
        batch = _batch(reference)
        steps = reference.meta["train"]["steps"]
        dtype = None if case.dtype == "fp32" else torch_dtype(case.dtype)
        state: dict = {"microbatches": 1, "kernel": contextlib.nullcontext}

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
                                                packed, state["microbatches"])
            state["engine"] = engine

        def twin(draw: str) -> None:
            """The single-device run as another draw of its dtype's noise (harness.rank.noise)."""
            name, _, seed = draw.partition(":")
            if name == "nudged":
                noise.perturb(model, int(seed))
            elif name == "microbatch":
                state["microbatches"] = batch.size
            elif name == "math_kernel":
                state["kernel"] = noise.math_kernel
            else:
                raise ValueError(f"unknown noise draw {draw!r}; known: {', '.join(noise.DRAWS)}")

        def recorded(recording=None) -> dict:
            """K steps; the proof's recording covers step 1's forward and backward (the optimizer is not diffusers')."""
            if "trainer" not in state:  # the single-device baseline runs without a layout
                parallelize(None)
            with state["kernel"]():
                return {**state["trainer"].run(recording), "engine": state["engine"]}

        def forward():
            if "trainer" not in state:
                parallelize(None)
            return state["trainer"].first_forward()

        def buffers() -> dict:
            """The batch the loop trains on, as PyTorch's context parallelism shards it (tcp layouts)."""
            return training.sequence_buffers(state["trainer"].batch, spec.torch_cp_buffers)

        return Built(model, recorded, cp_plan=spec.context_parallel_plan(model.config), parallelize=parallelize,
                     recorded=recorded, forward=forward, loss=forward, twin=twin,
                     torch_cp_buffers=buffers if spec.torch_cp_buffers else None)

    def detach(self, output):
        return output

    def comparable(self, output):
        """Everything a rank ends with, in one vector: every rank of a correct loop holds the same."""
        import torch

        parts = [output["losses"].float()] + [output[key][name].flatten() for key in ("gradients", "weights")
                                              for name in sorted(output[key])]
        return torch.cat(parts).contiguous()

    def measure(self, output, reference, baseline, case, images_dir, draws=None) -> dict:
        """Against the fp32 reference; in low precision also the single-device run of the same dtype (`baseline`)
        and the other draws of its noise (`draws`), whose largest errors set the limits."""
        from harness.rank.compare import training_errors

        expected = _expected(reference)
        metrics = training_errors(output, *expected)
        metrics.update(losses=output["losses"].tolist(), reference_losses=reference.output.tolist(),
                       engine=output.get("engine"), disagreement=output.get("disagreement", {}))
        metrics["noise"], metrics["noise_errors"] = {}, {}
        for name, run in {SINGLE: baseline, **(draws or {})}.items():
            if isinstance(run, str):
                metrics["noise_errors"][name] = run
                continue
            errors = training_errors(run, *expected)
            metrics["noise"][name] = {"loss_rel_err": errors["loss_rel_err"], "grad_err": errors["grad_err"],
                                      "params": {key: value["rel_l2"] for key, value in errors["param_errors"].items()}}
            if name == SINGLE:
                metrics["baseline_losses"] = run["losses"].tolist()
        return metrics

    def draws_for(self, case) -> tuple[str, ...]:
        """Low precision is judged against the noise of its dtype: the single-device run and these other draws."""
        from harness.rank import noise

        return noise.DRAWS if case.dtype != "fp32" else ()

    def judge(self, result, metrics: dict, policy: TrainPolicy) -> list[Evidence]:
        """Every check, each failure an item naming its parameter. Always: no NaN/Inf, a gradient for every
        parameter, and ranks that agree bit for bit on the losses and every plain parameter. fp32: the loss, each
        parameter's gradient and weights within their limits (bitwise-equal losses with `exact`). Low precision
        (mixed precision): the loss, all gradients together and each parameter's gradient within the budget of the
        noise the dtype alone makes, measured by five single-device runs of the dtype (the weights after a few AdamW
        steps are noise in low precision: its first steps move every weight by about the learning rate, whatever
        the sign noise)."""
        nonfinite = metrics["nonfinite"]
        found = []
        if nonfinite:
            found.append(Evidence("nonfinite", f"training produced {nonfinite} non-finite values (NaN/Inf)",
                                  value=nonfinite, limit=0))
        found += [Evidence("missing_grad", f"no gradient for {name}", name) for name in metrics["missing"]]
        found += per_subject("ranks_disagree", metrics["disagreement"], 0.0,
                             "the ranks disagree on {subject} (each rank trains its own copy) by", ">")
        limits = self._limits(metrics, policy, result.dtype)
        derived = _derivations(policy, result.dtype)
        figures = [GRAD.of(metrics["grad_err"], limits["grad_err"], derived["grad_err"],
                           ideal=limits["grad_err"] / policy.budget_factor if limits["grad_err"] else None),
                   LOSS.of(metrics["loss_rel_err"], limits["loss_rel"], derived["loss_rel"]),
                   WORST.of(metrics["worst_param"]),
                   WEIGHTS.of(metrics["weight_max_abs_err"], limits["weights"], derived["weights"]),
                   NONFINITE.of(nonfinite), *_worst_gradient(metrics, limits, derived["params"])]
        if result.dtype == "fp32":
            found += self._judge_fp32(metrics, policy.limits, policy.exact)
        else:
            found += self._judge_low_precision(result.dtype, metrics, policy, limits, figures)
        single = metrics.get("noise", {}).get(SINGLE)
        if single is not None:
            # fp32: against the per-gradient limit (a changed model, backend or compiler moves one device off too)
            figures.append(SINGLE_RUN.of(single["grad_err"], policy.limits["grad_rel"] if result.dtype == "fp32"
                                         else None))
        worst = _worst_gradients(metrics, limits)
        result.extra["train"] = _details(metrics, limits)
        result.extra["blocks"] = _blocks(metrics, result.dtype, worst)
        result.figures = figures
        return found

    @staticmethod
    def _judge_fp32(metrics: dict, limits: dict, exact: bool) -> list[Evidence]:
        found = []
        if exact and not metrics["loss_bitwise_equal"]:
            found.append(Evidence("loss_exact", f"losses not bitwise equal to the reference (exact; max abs diff "
                                                f"{metrics['loss_abs_err']:.3g})", value=metrics["loss_abs_err"],
                                  limit=0.0))
        if not metrics["loss_rel_err"] <= limits["loss_rel"]:
            found.append(Evidence("loss_rel", f"loss: rel err {metrics['loss_rel_err']:.3g} > {limits['loss_rel']:.3g}",
                                  value=metrics["loss_rel_err"], limit=limits["loss_rel"]))
        found += per_subject("grad_rel", {name: value["rel_l2"] for name, value in metrics["param_errors"].items()},
                             limits["grad_rel"], "gradient of {subject} (rel L2 err)")
        found += per_subject("weight_abs", metrics["weight_errors"], limits["weight_abs"],
                             "weights of {subject} after the last step (max abs err)")
        return found

    def _judge_low_precision(self, dtype: str, metrics: dict, policy: TrainPolicy, limit: dict,
                             figures: list) -> list[Evidence]:
        if metrics["noise_errors"]:
            failed = "; ".join(f"{name}: {error}" for name, error in metrics["noise_errors"].items())
            return [Evidence("cannot_judge", f"cannot judge: the single-device {dtype} training failed "
                                             f"({failed}), so there is no measure of its noise")]
        noise_err = max(run["grad_err"] for run in metrics["noise"].values())
        ratio, times = _ratio(metrics["grad_err"], noise_err), policy.noise_factor
        figures += [NOISE.of(noise_err), RATIO.of(ratio, policy.budget_factor)]
        found = []
        if not ratio <= policy.budget_factor:
            found.append(Evidence("grad_err_ratio", f"gradients: rel L2 err {metrics['grad_err']:.3g} is "
                                                    f"{ratio:.2f}x the single-device {dtype} noise {noise_err:.3g} "
                                                    f"(budget {policy.budget_factor}x)",
                                  value=ratio, limit=policy.budget_factor))
        if not metrics["loss_rel_err"] <= limit["loss_rel"]:
            found.append(Evidence("loss_rel", f"loss: rel err {metrics['loss_rel_err']:.3g} > {limit['loss_rel']:.3g} "
                                              f"({times}x the single-device {dtype} noise)",
                                  value=metrics["loss_rel_err"], limit=limit["loss_rel"]))
        found += per_subject("grad_rel", {name: value["rel_l2"] for name, value in metrics["param_errors"].items()},
                             limit["params"], f"gradient of {{subject}} (rel L2 err, {times}x the single-device "
                                              f"{dtype} noise)")
        return found

    @staticmethod
    def _limits(metrics: dict, policy: TrainPolicy, dtype: str) -> dict:
        """The limits a case answers to: fp32 the fixed ones; low precision `noise_factor` x the largest error of
        the single-device runs of its dtype (its noise, measured: harness.rank.noise), per parameter and for the
        loss, and `budget_factor` x theirs for all gradients together; None where a figure answers to none."""
        runs = list(metrics.get("noise", {}).values())
        if dtype == "fp32":
            fixed = policy.limits or {}
            return {"params": {name: fixed.get("grad_rel") for name in metrics["param_errors"]},
                    "loss_rel": fixed.get("loss_rel"), "grad_err": None, "weights": fixed.get("weight_abs")}
        if not runs or metrics.get("noise_errors"):
            return {"params": {}, "loss_rel": None, "grad_err": None, "weights": None}
        return {"params": {name: policy.noise_factor * max(run["params"].get(name, 0.0) for run in runs)
                           for name in metrics["param_errors"]},
                "loss_rel": policy.noise_factor * max(run["loss_rel_err"] for run in runs),
                "grad_err": policy.budget_factor * max(run["grad_err"] for run in runs), "weights": None}

    def rank_tolerance(self, policy) -> float | None:
        """None: the judge compares what the ranks end with itself, bit for bit and by name (the losses and every
        plain parameter; a DTensor is one value once gathered), so a generic comparison would only repeat it."""
        return None

    def flow_reference(self, reference, output) -> tuple:
        """One device's training with the flow's calls (an adapter added: its parameters train, the frozen ones
        not) in place of the file's: its losses, step-1 gradients and final weights; the effect is the largest
        relative change of a step's loss, the measure of the `loss_rel` check."""
        kept = {key: value for key, value in reference.extras.items() if not key.startswith((_GRAD, _FINAL))}
        extras = {**kept, **{_GRAD + name: value for name, value in output["gradients"].items()},
                  **{_FINAL + name: value for name, value in output["weights"].items()}}
        losses, expected = output["losses"].double(), reference.output.double()
        effect = float(((losses - expected).abs() / expected.abs().clamp_min(1e-30)).max())
        return replace(reference, output=output["losses"], extras=extras), effect

    def flow_effect_limit(self, policy) -> float | None:
        return (policy.limits or {}).get("loss_rel")

def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else (0.0 if value == 0 else float("inf"))


def _derivations(policy: TrainPolicy, dtype: str) -> dict[str, str]:
    """How each limit of `_limits` was derived, in words (the case says it beside the check it decided)."""
    if dtype == "fp32":
        return {"params": "fixed, grad_rel of train_limits", "loss_rel": "fixed, loss_rel of train_limits",
                "weights": "fixed, weight_abs of train_limits", "grad_err": ""}
    draw = f"the noisiest single-device {dtype} draw"
    return {"params": f"{policy.noise_factor} x its gradient error in {draw} (train noise_factor)",
            "loss_rel": f"{policy.noise_factor} x the loss error of {draw} (train noise_factor)",
            "grad_err": f"{policy.budget_factor} x the gradient error of {draw} (budget_factor)", "weights": ""}


def _worst_gradient(metrics: dict, limits: dict, derived: str) -> list[dict]:
    """The parameter whose gradient error used most of its limit, as a figure (none where no parameter has one)."""
    measured = [(name, error["rel_l2"], limits["params"].get(name)) for name, error in metrics["param_errors"].items()]
    checked = [(name, value, limit) for name, value, limit in measured if limit is not None]
    if not checked:
        return []
    name, value, limit = max(checked, key=lambda item: margin(item[1], item[2]))
    return [WORST_GRAD.of(value, limit, derived, subject=name)]


def _recipe_hash(config_hash: str) -> str:
    """The spec's config hash and the training recipe: a reference trained another way is stale."""
    from harness.rank import training

    payload = json.dumps({"config": config_hash, "recipe": training.RECIPE}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _batch(reference):
    from harness.rank import training

    conditions = {key: value for key, value in reference.inputs.items() if key != "hidden_states"}
    return training.Batch(conditions, tuple(reference.meta["train"]["batched"]), reference.inputs["hidden_states"],
                          reference.extras["noise"], reference.extras["sigmas"])


def _expected(reference) -> tuple:
    gradients = {key[len(_GRAD):]: value for key, value in reference.extras.items() if key.startswith(_GRAD)}
    weights = {key[len(_FINAL):]: value for key, value in reference.extras.items() if key.startswith(_FINAL)}
    return reference.output, gradients, weights


def _worst_gradients(metrics: dict, limits: dict) -> list[list]:
    """The ten parameters whose step-1 gradient is furthest from the reference: name, rel L2 and max abs error, the
    single-device run's error and the largest noise draw's (low precision), and the limit it answered to."""
    runs, params = metrics.get("noise", {}), limits["params"]
    worst = sorted(metrics["param_errors"].items(), key=lambda item: -item[1]["rel_l2"])[:10]
    return [[name, value["rel_l2"], value["max_abs"],
             runs[SINGLE]["params"].get(name) if SINGLE in runs else None,
             max((run["params"].get(name, 0.0) for run in runs.values()), default=None), params.get(name)]
            for name, value in worst]


def _details(metrics: dict, limits: dict) -> dict:
    """What a train case keeps besides its figures and blocks: the tightest margin to a limit, the noise draws' own
    figures, and how the loop ran."""
    params = limits["params"]
    closest = max(((value["rel_l2"] / params[name], name) for name, value in metrics["param_errors"].items()
                   if params.get(name)), default=None)
    return {
        "closest_to_limit": None if closest is None else {"param": closest[1], "ratio": closest[0]},
        "loss_limit": limits["loss_rel"],
        "noise": {name: {"loss_rel_err": run["loss_rel_err"], "grad_err": run["grad_err"]}
                  for name, run in metrics.get("noise", {}).items()} or None,
        **{key: metrics.get(key) for key in ("loss_abs_err", "loss_bitwise_equal", "grad_max_abs_err", "engine",
                                             "disagreement", "missing")},
    }


def _blocks(metrics: dict, dtype: str, worst: list[list]) -> list[dict]:
    """What the page draws of a train case: the loss of every step and the gradients furthest from the reference."""
    lines = [("reference (fp32, one device)", metrics["reference_losses"], "ref"), ("this layout", metrics["losses"],
                                                                                     "run")]
    if metrics.get("baseline_losses") and dtype != "fp32":
        lines.append((f"one device, {dtype}", metrics["baseline_losses"], "base"))
    engine = f"data parallel by {metrics['engine']}" if metrics.get("engine") else ""
    return [series("Loss per step", lines, note=engine),
            table("Step-1 gradients furthest from the reference",
                  ["parameter", "rel L2 err", "max abs err", "one device, same dtype", "largest noise draw", "limit"],
                  worst, code_columns=(0,))]
