"""The tensor kind's part of a `harness repro` script: one forward on one device and one under the layout, each
compared with the fp32 reference output as the harness judges it (harness/kinds/tensor.py): fp32 by the max abs
error against the tolerance; low precision by the tolerance and the error budget against the single-device run of
the same dtype and backend."""

from harness.versions.repro_scripts.common import (
    CASE,
    DTYPES,
    FLOW_INPUTS,
    Reference,
    describe,
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


def forward(reference, dtype, device, parallel, backend=None):
    model = loaded_model(reference, dtype, device, parallel, backend).eval()
    inputs = older_release_inputs(model, {key: moved(value, device, dtype) for key, value in reference.inputs.items()})
    if FLOW_INPUTS is not None:  # what the flow passes with each call (an IP-Adapter's image)
        inputs.update(FLOW_INPUTS(model, device, dtype))
    with torch.no_grad():
        output = model(**inputs, return_dict=False)[0]
    if hasattr(output, "full_tensor"):  # diffusers returns plain tensors; the harness calls a DTensor a FAIL
        print(f"note: the output is a DTensor {tuple(output.placements)}, gathered to compare", flush=True)
        output = output.full_tensor()
    return output.detach().double().cpu()


def errors(candidate, expected):
    diff = (candidate - expected.double()).abs()
    return float(diff.max()), float(diff.mean()), int((~torch.isfinite(candidate)).sum())


def judge(parallel, single, reference):
    """The harness's verdict of the case (harness/kinds/tensor.py)."""
    max_err, mean_err, nonfinite = errors(parallel, reference)
    broken = [f"{nonfinite} non-finite values"] if nonfinite else []
    if not max_err <= CASE["tolerance"]:
        broken.append(f"max abs err {max_err:.3g} > tolerance {CASE['tolerance']:.3g}")
    if CASE["dtype"] != "fp32" and not broken:
        base_max, base_mean, _ = errors(single, reference)
        mean_ratio, max_ratio = mean_err / base_mean, max_err / base_max
        print(f"  error budget: mean {mean_ratio:.3f}x (budget {CASE['budget_factor']}x), max {max_ratio:.3f}x "
              f"(budget {CASE['budget_max_factor']}x) the single-device {CASE['dtype']} error")
        if mean_ratio > CASE["budget_factor"] or max_ratio > CASE["budget_max_factor"]:
            broken.append("over the error budget")
    return verdict(broken)


def main():
    rank, world, device = start()
    reference, dtype = Reference(reference_path()), DTYPES[CASE["dtype"]]
    say(rank, describe(reference, world))
    if CASE.get("flow") is not None and rank == 0:  # as the harness judges a flow: against one device making its
        # calls in fp32 with native attention, in place of the file's output
        reference.output = forward(reference, torch.float32, device, parallel=False, backend="native").float()
        print(f"  reference: one device (native, fp32) after {CASE['flow']['call']}", flush=True)
    single = forward(reference, dtype, device, parallel=False) if rank == 0 else None
    output = forward(reference, dtype, device, parallel=True) if world > 1 else single
    if rank == 0:
        max_err, mean_err, _ = errors(single, reference.output)
        print(f"  single device ({CASE['backend']}, {CASE['dtype']}) vs reference: max abs err {max_err:.3g}, "
              f"mean abs err {mean_err:.3g}")
        max_err, mean_err, _ = errors(output, reference.output)
        print(f"  {CASE['layout']['name']} ({CASE['backend']}, {CASE['dtype']}) vs reference: max abs err "
              f"{max_err!r} ({max_err:.3g}), mean abs err {mean_err:.3g}, tolerance {CASE['tolerance']:.3g}")
        print(f"  {CASE['layout']['name']} vs single device: max abs err {errors(output, single)[0]:.3g}")
        print(f"{CASE['id']}: {judge(output, single, reference.output)}", flush=True)
    finish(world)


if __name__ == "__main__":
    main()
