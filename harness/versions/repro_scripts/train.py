"""The train kind's part of a `harness repro` script: K AdamW steps of flow-matching training from the reference's
seed weights on the reference's batch (every step's noise and sigmas), on one device and under the layout, each
compared with the fp32 reference as the harness judges it (harness/kinds/train.py, harness/rank/training.py): each
step's loss, every parameter's gradient at step 1 (relative L2 error) and the weights after the last step.

Under a context-parallel layout every rank computes the loss of the whole gathered output, and diffusers' gather
hands each rank its own chunk's share of the gradient, so the full gradient is the sum over the ranks: the loop
all-reduces (sums) every gradient, as a correct context-parallel training loop does."""

from harness.versions.repro_scripts.common import (
    CASE,
    DTYPES,
    Reference,
    contextlib,
    describe,
    dist,
    finish,
    loaded_model,
    moved,
    older_release_inputs,
    reference_path,
    say,
    start,
    torch,
    verdict,
)

# --- script ---


def loss_at(model, reference, step, device, autocast):
    """The mean squared error between the predicted and the true velocity at `step` (diffusers' flow-matching
    training scripts: noisy = (1 - sigma) * latents + sigma * noise, target = noise - latents)."""
    latents = moved(reference.inputs["hidden_states"], device)
    noise, sigmas = moved(reference.extras["noise"][step], device), moved(reference.extras["sigmas"][step], device)
    expand = sigmas.reshape(-1, *([1] * (latents.dim() - 1)))
    noisy = (1 - expand) * latents + expand * noise
    conditions = {key: moved(value, device) for key, value in reference.inputs.items() if key != "hidden_states"}
    timestep = {key: sigmas * CASE["timestep_scale"] for key in CASE["timestep_keys"]}
    inputs = older_release_inputs(model, {"hidden_states": noisy, **timestep, **conditions})
    with autocast():
        prediction = model(**inputs, return_dict=False)[0]
    return torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())


def train(reference, device, parallel):
    """Losses, step-1 gradients and final weights (whole fp32 CPU tensors) of the reference's recipe."""
    model = loaded_model(reference, torch.float32, device, parallel)
    dtype = DTYPES[CASE["dtype"]]
    autocast = contextlib.nullcontext if dtype == torch.float32 else (lambda: torch.autocast(device.type, dtype))
    recipe, named = reference.meta["train"]["recipe"], dict(model.named_parameters())
    optimizer = torch.optim.AdamW(named.values(), lr=recipe["lr"], betas=tuple(recipe["betas"]), eps=recipe["eps"],
                                  weight_decay=recipe["weight_decay"], foreach=False)
    losses, gradients = [], {}
    model.train()
    for step in range(reference.meta["train"]["steps"]):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_at(model, reference, step, device, autocast)
        loss.backward()
        if parallel:  # the sum over the context-parallel ranks (see the docstring)
            for parameter in named.values():
                if parameter.grad is not None:
                    dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
        if step == 0:
            gradients = {name: p.grad.detach().float().cpu().clone() for name, p in named.items() if p.grad is not None}
        optimizer.step()
        losses.append(float(loss.detach()))
    weights = {name: p.detach().float().cpu().clone() for name, p in named.items()}
    return torch.tensor(losses, dtype=torch.float64), gradients, weights


def errors(run, reference):
    """The harness's training figures against the reference (harness/rank/compare.py, training_errors)."""
    losses, gradients, weights = run
    expected = reference.output.double()
    loss_rel = float(((losses - expected).abs() / expected.abs().clamp_min(1e-30)).max())
    per_param, squared_diff, squared_norm = {}, 0.0, 0.0
    for name, want in ((k[len("grad."):], v) for k, v in reference.extras.items() if k.startswith("grad.")):
        got = gradients.get(name)
        if got is None:
            per_param[name] = float("inf")
            continue
        diff, norm = (got.double() - want.double()).norm().item() ** 2, want.double().norm().item() ** 2
        squared_diff, squared_norm = squared_diff + diff, squared_norm + norm
        per_param[name] = diff ** 0.5 / max(norm ** 0.5, 1e-30)
    weight_err = max(float((weights[k[len("final."):]].double() - v.double()).abs().max())
                     for k, v in reference.extras.items() if k.startswith("final."))
    return {"loss_rel": loss_rel, "grad_err": squared_diff ** 0.5 / max(squared_norm ** 0.5, 1e-30),
            "per_param": per_param, "weights": weight_err}


def judge(found, single):
    """The harness's verdict (harness/kinds/train.py): fp32 by fixed limits. Low precision: the harness takes the
    largest error of five single-device draws of the dtype's noise; this script has the first draw only, so its
    limits (noise_factor x that run) are at most the harness's: a PASS here is one there."""
    limits, factor = CASE["limits"], CASE["noise_factor"]
    if CASE["dtype"] == "fp32":
        wrong = [name for name, value in found["per_param"].items() if value > limits["grad_rel"]]
        broken = [f"loss rel err {found['loss_rel']:.3g} > {limits['loss_rel']:.3g}"] \
            if found["loss_rel"] > limits["loss_rel"] else []
        broken += [f"{len(wrong)} parameter gradient(s) rel L2 err > {limits['grad_rel']:.3g}"] if wrong else []
        if found["weights"] > limits["weight_abs"]:
            broken.append(f"weights max abs err {found['weights']:.3g} > {limits['weight_abs']:.3g}")
        return verdict(broken)
    ratio = found["grad_err"] / single["grad_err"] if single["grad_err"] > 0 else float("inf")
    broken = [f"gradients {ratio:.2f}x the single-device {CASE['dtype']} (budget {CASE['budget_factor']}x)"] \
        if ratio > CASE["budget_factor"] else []
    if found["loss_rel"] > factor * single["loss_rel"]:
        broken.append(f"loss rel err {found['loss_rel']:.3g} beyond {factor}x the single-device one")
    wrong = [name for name, value in found["per_param"].items()
             if value > factor * single["per_param"].get(name, 0.0)]
    broken += [f"{len(wrong)} parameter gradient(s) beyond {factor}x the single-device ones"] if wrong else []
    return verdict(broken)


def show(what, found):
    worst = sorted(found["per_param"].items(), key=lambda item: -item[1])[:3]
    print(f"  {what}: loss rel err {found['loss_rel']:.3g}; step-1 gradients rel L2 err (all parameters) "
          f"{found['grad_err']!r} ({found['grad_err']:.3g}); worst: "
          + ", ".join(f"{name} {value:.3g}" for name, value in worst)
          + f"; weights after the last step max abs err {found['weights']:.3g}")


def main():
    rank, world, device = start()
    reference = Reference(reference_path())
    say(rank, describe(reference, world))
    single = errors(train(reference, device, parallel=False), reference) if rank == 0 else None
    found = errors(train(reference, device, parallel=True), reference) if world > 1 else single
    if rank == 0:
        show(f"single device ({CASE['backend']}, {CASE['dtype']}) vs reference", single)
        show(f"{CASE['layout']['name']} ({CASE['backend']}, {CASE['dtype']}) vs reference", found)
        if CASE["dtype"] == "fp32":
            print(f"  limits: loss rel {CASE['limits']['loss_rel']:.3g}, gradient rel L2 "
                  f"{CASE['limits']['grad_rel']:.3g} per parameter")
        else:
            print(f"  limits: {CASE['noise_factor']}x the single-device {CASE['dtype']} run's errors")
        print(f"{CASE['id']}: {judge(found, single)}", flush=True)
    finish(world)


if __name__ == "__main__":
    main()
