"""The train kind's pieces on one process: the batch, the packed-parameter order, the loop, the reference, the
verdict, the backward probe and the data-parallel layouts. Real multi-rank training is in test_negative_controls."""

from __future__ import annotations

import pytest
import torch

from harness.catalogue.zoo import get_spec
from harness.core.errors import HarnessError
from harness.core.layouts import parse_layout
from harness.core.reference import read_reference
from harness.core.results import CaseResult, Status
from harness.kinds import kind_of
from harness.rank import backends, training
from tests.judging import settings


def test_samples_stack_on_their_sample_axis_and_shared_inputs_stay_whole():
    batch = training.make_batch(get_spec("qwenimage"), "masked", steps=2)
    assert batch.latents.shape[0] == training.RECIPE["batch"] == batch.sigmas.shape[1] == batch.noise.shape[1]
    assert batch.conditions["img_shapes"] == [(1, 4, 4), (1, 4, 4)]
    assert set(batch.batched) == {"encoder_hidden_states", "encoder_hidden_states_mask", "img_shapes"}
    assert not torch.equal(batch.latents[0], batch.latents[1])  # two different samples, not one repeated
    flux = training.make_batch(get_spec("flux"), "default", steps=2)
    assert flux.conditions["img_ids"].shape == (16, 3) and "img_ids" not in flux.batched


def test_an_input_that_differs_per_sample_without_a_sample_axis_is_refused():
    with pytest.raises(HarnessError, match="'ids' differs between samples"):
        training.stack_samples([{"ids": torch.zeros(3, 2)}, {"ids": torch.ones(3, 2)}])


def test_data_parallel_parts_cover_the_batch_once():
    batch = training.make_batch(get_spec("flux"), "default", steps=3)
    parts = [batch.part(index, 2) for index in range(2)]
    assert torch.equal(torch.cat([p.latents for p in parts]), batch.latents)
    assert torch.equal(torch.cat([p.noise for p in parts], dim=1), batch.noise)
    with pytest.raises(HarnessError, match="does not split over 4"):
        batch.part(0, 4)


def test_packed_shards_are_put_back_in_the_model_order():
    model = torch.arange(12.0).reshape(1, 12)  # blocks of 4 and 8 columns, sharded block by block over 2 ranks
    local = [torch.cat([model[:, rank * 2:(rank + 1) * 2], model[:, 4 + rank * 4:4 + (rank + 1) * 4]], 1)
             for rank in range(2)]
    gathered = torch.cat(local, 1)  # what full_tensor() returns
    assert not torch.equal(gathered, model)
    assert torch.equal(training.unpack(gathered, 1, [4, 8], 2), model)


@pytest.mark.parametrize("model", ["flux", "flux2"])
def test_packed_layouts_read_from_the_plan_agree_with_diffusers_own_resolver(model):
    """0.40.0 has the packed styles but no `resolve_tp_shard_specs`: the harness reads them from the plan itself. Where
    both exist they must agree, and flux's single-block `proj_out` (cat(attention, MLP) in) must be among them."""
    pytest.importorskip("diffusers.hooks.tensor_parallel", reason="tensor parallelism needs diffusers >= 0.40")
    from diffusers.hooks import tensor_parallel

    if not hasattr(tensor_parallel, "resolve_tp_shard_specs"):
        pytest.skip("this diffusers has no resolve_tp_shard_specs to compare with")
    built = get_spec(model).build()
    own = training.packed_parameters(built, 2)
    assert training._packed_from_plan(built, 2) == own
    if model == "flux":
        assert own["single_transformer_blocks.0.proj_out.weight"][:2] == (1, [64, 256])


def test_a_run_starts_again_from_the_seed_weights_and_learns():
    spec = get_spec("flux")
    model = spec.build()
    trainer = training.Trainer(model, model, training.make_batch(spec, "default", 2), 2, spec, None,
                               torch.device("cpu"), training.Groups())
    first, second = trainer.run(), trainer.run()
    assert torch.equal(first["losses"], second["losses"])
    assert all(torch.equal(first["weights"][n], second["weights"][n]) for n in first["weights"])
    moved = [n for n, w in first["weights"].items() if not torch.equal(w, trainer.initial[n])]
    assert len(moved) == len(first["weights"])  # AdamW moved every parameter
    assert set(first["gradients"]) == set(first["weights"])


def test_the_reference_holds_losses_gradients_weights_and_the_batch(tmp_path):
    path, written = kind_of("train").capture("flux", "default", tmp_path, steps=2)
    reference = read_reference(path)
    assert written and reference.meta["train"]["steps"] == 2 and reference.output.shape == (2,)
    assert reference.extras["noise"].shape[:2] == (2, 2) and reference.extras["sigmas"].shape == (2, 2)
    names = set(get_spec("flux").build().state_dict())
    assert {k[len("grad."):] for k in reference.extras if k.startswith("grad.")} == names
    assert {k[len("final."):] for k in reference.extras if k.startswith("final.")} == names


def _metrics(**change):
    base = {"loss_rel_err": 1e-7, "loss_abs_err": 2e-7, "loss_bitwise_equal": False, "grad_err": 1e-7,
            "grad_max_abs_err": 1e-9, "worst_param": "a.weight", "weight_max_abs_err": 1e-5, "missing": [],
            "nonfinite": 0, "disagreement": {}, "losses": [1.0, 0.9], "reference_losses": [1.0, 0.9],
            "param_errors": {"a.weight": {"rel_l2": 5e-7, "max_abs": 1e-9}, "b.bias": {"rel_l2": 1e-7, "max_abs": 0}},
            "weight_errors": {"a.weight": 1e-5, "b.bias": 1e-6}}
    return {**base, **change}


def _judge(metrics, dtype="fp32", exact=False):
    """(status, reason, the failed checks) of a synthetic train case."""
    from harness.run.verdict import settle

    result = CaseResult("x", "flux", "default", "train", "ulysses2", 2, "native", dtype)
    kind = kind_of("train")
    items = kind.judge(result, metrics, kind.policy(settings(exact=exact), dtype))
    settle(result, items)
    return result.status, result.reason, [(item.check, item.subject) for item in items]


def test_fp32_verdicts_run_every_check_and_name_what_broke():
    assert _judge(_metrics()) == (Status.PASS, "", [])
    status, reason, _ = _judge(_metrics(param_errors={"a.weight": {"rel_l2": 0.5, "max_abs": 1e-3}}))
    assert status is Status.FAIL and reason == "gradient of a.weight (rel L2 err) 0.5 > 0.0001"
    status, reason, items = _judge(_metrics(disagreement={"norm.weight": 3e-3, "loss": 1e-6}))
    assert status is Status.FAIL and "the ranks disagree on norm.weight (each rank trains its own copy) by" in reason
    assert items == [("ranks_disagree", "norm.weight"), ("ranks_disagree", "loss")]
    assert _judge(_metrics(missing=["b.bias"]))[2] == [("missing_grad", "b.bias")]
    assert _judge(_metrics(nonfinite=2))[0] is Status.FAIL
    assert _judge(_metrics(weight_errors={"a.weight": 2e-3, "b.bias": 0.0}))[2] == [("weight_abs", "a.weight")]
    status, reason, _ = _judge(_metrics(), exact=True)
    assert status is Status.FAIL and "bitwise" in reason
    assert _judge(_metrics(loss_bitwise_equal=True), exact=True)[0] is Status.PASS
    # Not the first failure only: every check that failed is evidence of its own.
    everything = _metrics(disagreement={"n.weight": 1e-3}, loss_rel_err=3e-4,
                          param_errors={"a.weight": {"rel_l2": 0.5, "max_abs": 1e-3}, "b.bias": {"rel_l2": 0.2,
                                                                                                 "max_abs": 0}})
    assert [check for check, _ in _judge(everything)[2]] == ["ranks_disagree", "loss_rel", "grad_rel", "grad_rel"]


def _low(param_errors, own, draw, **change):
    """A low-precision case with its single-device run (`own`) and one other noise draw (`draw`)."""
    noise = {"single": {"loss_rel_err": 1e-3, "grad_err": 1e-2, "params": own},
             "nudged:1": {"loss_rel_err": 0.9e-3, "grad_err": 1.05e-2, "params": draw}}
    return _metrics(loss_rel_err=1.2e-3, grad_err=1.1e-2, param_errors=param_errors, noise=noise, noise_errors={},
                    **change)


def test_low_precision_answers_to_the_noise_of_its_own_dtype():
    """The limit of each gradient is noise_factor (2) x the largest of the single-device draws of the dtype: a noisy
    parameter (0.19 and 0.25 on one device) may be 0.3, a quiet one (0.01) may not be 0.1."""
    noisy = {"a.weight": {"rel_l2": 0.3, "max_abs": 1e-3}, "b.bias": {"rel_l2": 0.012, "max_abs": 0}}
    own, draw = {"a.weight": 0.19, "b.bias": 0.01}, {"a.weight": 0.25, "b.bias": 0.011}
    assert _judge(_low(noisy, own, draw), "bf16") == (Status.PASS, "", [])
    status, reason, _ = _judge({**_low(noisy, own, draw), "grad_err": 2.5e-2}, "bf16")
    assert status is Status.FAIL and "2.38x the single-device bf16 noise" in reason
    wrong = {**noisy, "b.bias": {"rel_l2": 0.1, "max_abs": 1e-2}}  # a 10% error in a quiet parameter
    status, reason, items = _judge(_low(wrong, own, draw), "bf16")
    assert status is Status.FAIL and items == [("grad_rel", "b.bias")]
    assert reason.startswith("gradient of b.bias (rel L2 err, 2.0x the single-device bf16 noise) 0.1 > 0.022")
    assert _judge({**_low(noisy, own, draw), "loss_rel_err": 1.9e-3}, "bf16")[0] is Status.PASS
    status, _, items = _judge({**_low(noisy, own, draw), "loss_rel_err": 2.1e-3}, "bf16")
    assert items == [("loss_rel", "")]  # 2 x 1e-3, no floor above it
    assert _judge({**_low(noisy, own, draw), "noise_errors": {"microbatch": "boom"}}, "bf16")[0] is Status.ERROR


def test_the_backward_probe_skips_what_cannot_train():
    assert backends.backward_missing("native", parse_layout("ulysses2")) is None
    assert "not implemented" in backends.backward_missing("native", parse_layout("ulysses2any"))
    assert "not implemented" in backends.backward_missing("native", parse_layout("ring2any"))
    if not torch.cuda.is_available():
        assert "no backward" in backends.backward_missing("flex", parse_layout("tp2"))


def test_data_parallel_layouts_apply_to_training_only():
    layout = parse_layout("dp2xulysses2")
    assert (layout.dp, layout.ulysses, layout.world_size) == (2, 2, 4)
    assert layout.mesh_spec() == ((2, 1, 2), ("dp", "ring", "ulysses"))
    assert kind_of("train").applies(layout) and not kind_of("tensor").applies(layout)
    from harness.run.plan import build_plan

    plan = build_plan(["flux"], ["dp2", "ulysses2"], ["native"], ["fp32"], kinds=("tensor", "train"))
    assert sorted(p.case.case_id for p in plan) == ["flux/dp2/native/fp32/train", "flux/ulysses2/native/fp32/tensor",
                                                   "flux/ulysses2/native/fp32/train"]


def test_the_train_kind_has_its_own_models_and_layouts_until_the_user_names_them(project):
    from harness.run.settings import load_settings

    quick = load_settings(start=project)
    assert quick.kind_scope("train")[0] == ["flux", "qwenimage"] and "dp2" in quick.kind_scope("train")[1]
    assert "dp2" not in quick.kind_scope("tensor")[1]
    assert load_settings({"models": "wan"}, start=project).kind_scope("train")[0] == ["wan"]
    assert load_settings({"layouts": "tp2"}, start=project).kind_scope("train")[1] == ["tp2"]


DDP_SCRIPT = """
import faulthandler; faulthandler.enable()  # a rank that aborts says where
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from harness.core import determinism
from harness.core.layouts import parse_layout
from harness.core.reference import read_reference
from harness.catalogue.zoo import get_spec
from harness.kinds.train import _batch, _expected
from harness.rank import training
from harness.rank.compare import training_errors
determinism.quiet_diffusers(); determinism.strict_fp32()
dist.init_process_group("gloo")
reference = read_reference(sys.argv[1])
spec = get_spec("flux")
model = spec.model_class()(**reference.meta["config"]); model.load_state_dict(reference.weights)
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
groups = training.Groups.of(parse_layout("dp2"), mesh)
wrapped = training.wrap_data_parallel(model, mesh, sys.argv[2])
part = _batch(reference).part(dist.get_rank(), 2).to(torch.device("cpu"))
ran = training.Trainer(wrapped, model, part, 3, spec, None, torch.device("cpu"), groups).run()
if dist.get_rank() == 0:
    errors = training_errors(ran, *_expected(reference))
    worst = max(value["rel_l2"] for value in errors["param_errors"].values())
    print(json.dumps({"loss": errors["loss_rel_err"], "grad": worst, "weights": errors["weight_max_abs_err"]}))
dist.destroy_process_group()
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # not Python's teardown: gloo's threads may still free works that hold Python objects (docs/reliability.md)
"""


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_both_data_parallel_engines_train_like_one_device(tmp_path, engine):
    """DDP is the engine where FSDP2 does not run: both, on two real ranks, give the reference's training."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path, _ = kind_of("train").capture("flux", "default", tmp_path, steps=3)
    script = tmp_path / "dp.py"
    script.write_text(DDP_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(path), engine], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-6000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["loss"] < 1e-6 and figures["grad"] < 1e-5 and figures["weights"] < 1e-4, figures
