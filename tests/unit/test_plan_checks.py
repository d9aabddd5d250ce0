"""`harness models --check`: the static plan checks on meta-device module trees.

Each deliberate fault is a real tiny class with a broken `_cp_plan` / `_tp_plan` (monkeypatched) that must come out
as a row, next to the clean class that gives none.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers  # noqa: E402
from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput  # noqa: E402

from harness import cli  # noqa: E402
from harness.catalogue import checks as plan_checks
from harness.catalogue.zoo import SPECS  # noqa: E402
from harness.catalogue.zoo.discover import parallel_classes  # noqa: E402

Flux = diffusers.FluxTransformer2DModel


def tree(name: str, **config) -> plan_checks.Tree:
    spec = SPECS[name]
    return plan_checks.build_tree(getattr(diffusers, spec.class_name), {**spec.config, **config}, name)


def errors(rows) -> list[plan_checks.Finding]:
    return [row for row in rows if row.severity == "error"]


def only(rows, key: str, text: str, severity: str = "error") -> plan_checks.Finding:
    found = [row for row in rows if row.key == key and text in row.reason and row.severity == severity]
    assert len(found) == 1, plan_checks.format_table(rows)
    return found[0]


@pytest.fixture(scope="module")
def flux() -> plan_checks.Tree:
    return tree("flux")


def test_clean_flux_plans_give_no_rows(flux):
    """The baseline of every negative control below: Flux's own plans on its tiny config are clean."""
    rows = plan_checks.check_cp_plan(flux, "_cp_plan", Flux._cp_plan)
    rows += plan_checks.check_tp_plan(flux, "_tp_plan", Flux._tp_plan)
    assert rows == []


def test_plan_copied_from_another_model_is_reported(monkeypatch):
    monkeypatch.setattr(Flux, "_cp_plan", diffusers.WanTransformer3DModel._cp_plan)
    rows, _ = plan_checks.check_all([Flux, diffusers.WanTransformer3DModel])
    flux_rows = [row for row in rows if row.class_name == "FluxTransformer2DModel"]
    row = only(flux_rows, "rope", "resolves nowhere")
    assert "resolves in WanTransformer3DModel" in row.reason and row.configs == ("flux", "default")
    only(flux_rows, "blocks.0", "'blocks' is not a submodule of 'FluxTransformer2DModel'")
    only(flux_rows, "(whole plan)", "all of them resolve in WanTransformer3DModel")
    assert not errors(row for row in rows if row.class_name == "WanTransformer3DModel")


def test_split_without_gather(monkeypatch, flux):
    plan = {key: value for key, value in Flux._cp_plan.items() if key != "proj_out"}
    monkeypatch.setattr(Flux, "_cp_plan", plan)
    rows = plan_checks.check_cp_plan(flux, "_cp_plan", Flux._cp_plan)
    only(rows, "(whole plan)", "splits but never gathers")


def test_block_that_splits_without_its_own_gather():
    """Helios splits and gathers around each block's attn1: one gather missing means a sharded sequence is split
    again in the next block, although a gather follows later."""
    helios = tree("helios")
    plan = {key: value for key, value in SPECS["helios"].context_parallel_plan().items() if key != "blocks.0.attn1"}
    rows = plan_checks.check_cp_plan(helios, "spec cp_plan", plan, from_config=True)
    assert [row.key for row in errors(rows)] == ["blocks.0.attn1"]
    only(rows, "blocks.0.attn1", "split here but not gathered here")


def test_split_input_names_and_dims(monkeypatch, flux):
    """A misspelt input name, an output index without split_output and a gather_dim past expected_dims: each is an
    error diffusers only meets at the first forward."""
    inputs = {**Flux._cp_plan[""], "hidden_state": ContextParallelInput(1, 3), 0: ContextParallelInput(0, 2)}
    monkeypatch.setattr(Flux, "_cp_plan", {**Flux._cp_plan, "": inputs, "proj_out": ContextParallelOutput(3, 3)})
    rows = plan_checks.check_cp_plan(flux, "_cp_plan", Flux._cp_plan)
    only(rows, "(root)", "'hidden_state' is not a parameter of FluxTransformer2DModel.forward")
    only(rows, "(root)", "integer key 0 without split_output=True")
    only(rows, "proj_out", "gather_dim 3 is out of range for expected_dims=3")


def test_attention_outside_the_split_region(monkeypatch, flux):
    """Splitting only from the single-stream blocks on leaves the double-stream attention on the whole sequence."""
    plan = {"single_transformer_blocks.0": {"hidden_states": ContextParallelInput(1, 3)},
            "proj_out": ContextParallelOutput(1, 3)}
    monkeypatch.setattr(Flux, "_cp_plan", plan)
    rows = plan_checks.check_cp_plan(flux, "_cp_plan", Flux._cp_plan)
    only(rows, "transformer_blocks.*.attn", "outside the split region", "warning")
    assert [row.key for row in rows] == ["transformer_blocks.*.attn"]


def test_attention_inside_the_region_that_ignores_the_cp_config():
    """A processor that calls SDPA itself attends only to its rank's chunk: the classic bug, found statically."""

    class LocalProcessor:
        def __call__(self, attn, hidden_states, **kwargs):
            return torch.nn.functional.scaled_dot_product_attention(hidden_states, hidden_states, hidden_states)

    local = tree("flux")
    local.modules["single_transformer_blocks.0.attn"].processor = LocalProcessor()
    rows = plan_checks.check_cp_plan(local, "_cp_plan", Flux._cp_plan)
    only(rows, "single_transformer_blocks.*.attn", "LocalProcessor has no `_parallel_config`")


def test_tp_colwise_out_features_not_divisible_by_the_degree(monkeypatch):
    """MiniMax's tiny audio head has 6 outputs: column-wise it shards at degree 2, not at 4."""
    minimax = diffusers.MiniMaxH3Transformer3DModel
    monkeypatch.setattr(minimax, "_tp_plan", {"audio_proj_out": "colwise"})
    rows = plan_checks.check_tp_plan(tree("minimax_h3"), "_tp_plan", minimax._tp_plan)
    row = only(rows, "audio_proj_out", "degree 4 fails: out_features blocks [6] do not divide")
    assert "degree 2 is fine" in row.reason


def test_tp_colwise_without_its_rowwise(monkeypatch, flux):
    """Without ff.net.2 the FF's sharded hidden features reach nothing that reduces them; ff_context.net.2 has the
    same size but pairs with its own projection."""
    plan = {key: style for key, style in Flux._tp_plan.items() if key != "transformer_blocks.*.ff.net.2"}
    monkeypatch.setattr(Flux, "_tp_plan", plan)
    rows = plan_checks.check_tp_plan(flux, "_tp_plan", Flux._tp_plan)
    only(rows, "transformer_blocks.*.ff.net.0.proj", "no row-wise layer of its block takes its output")
    assert len(errors(rows)) == 1


def test_tp_attention_sharded_by_halves(monkeypatch, flux):
    plan = {key: style for key, style in Flux._tp_plan.items() if not key.endswith(".attn.to_k")}
    monkeypatch.setattr(Flux, "_tp_plan", plan)
    rows = plan_checks.check_tp_plan(flux, "_tp_plan", Flux._tp_plan)
    only(rows, "transformer_blocks.*.attn", "not column-sharded: to_k")


def test_tp_heads_not_divisible():
    rows = plan_checks.check_tp_plan(tree("flux", num_attention_heads=3), "_tp_plan", Flux._tp_plan)
    only(rows, "transformer_blocks.*.attn", "3 heads do not divide by degree 2, 4")


def test_wan_is_not_ready_for_tensor_parallelism(monkeypatch):
    """A Flux-style TP plan on Wan: its QK norm spans all heads and its processor reshapes by `attn.heads`."""
    wan = diffusers.WanTransformer3DModel
    plan = {f"blocks.*.attn1.{name}": "colwise" for name in ("to_q", "to_k", "to_v")}
    monkeypatch.setattr(wan, "_tp_plan", {**plan, "blocks.*.attn1.to_out.0": "rowwise"})
    rows = plan_checks.check_tp_plan(tree("wan"), "_tp_plan", wan._tp_plan)
    only(rows, "blocks.*.attn1", "norm_q normalises across all heads")
    only(rows, "blocks.*.attn1", "reshapes by attn.heads")


FINDINGS_OF_0_42_1 = pytest.mark.skipif(diffusers.__version__ != "0.42.1", reason="a finding in diffusers 0.42.1")


@FINDINGS_OF_0_42_1
def test_minimax_token_refiner_runs_outside_the_split_region():
    """The refiner's attention runs on the whole text before `transformer_blocks.0` splits the packed sequence; the
    RoPE split before it carries no sequence, so it must not open the region."""
    rows, _ = plan_checks.check_all([diffusers.MiniMaxH3Transformer3DModel])
    row = only(rows, "token_refiner.refiner_blocks.*.attn", "outside the split region", "warning")
    assert row.configs == ("minimax_h3", "default") and len(rows) == 1


@FINDINGS_OF_0_42_1
def test_ltx2_cross_attention_rope_is_not_split():
    """`rope` is split, `cross_attn_rope` (video positions for audio-video cross-attention) is not: the cause of
    the known LTX2 failure. `audio_rope` and `cross_attn_audio_rope` embed the audio stream, which stays whole."""
    rows, _ = plan_checks.check_all([diffusers.LTX2VideoTransformer3DModel])
    only(rows, "cross_attn_rope", "same class as 'rope', whose output is split", "warning")
    assert len(rows) == 1


@FINDINGS_OF_0_42_1
def test_helios_plan_fits_forty_blocks_only():
    """The finding in diffusers 0.42.1: Helios's `_cp_plan` names blocks 0..39, so the tiny config (2 blocks) fails
    where the default config (40) resolves; the harness's pruned spec plan is clean."""
    rows, trees = plan_checks.check_all([diffusers.HeliosTransformer3DModel])
    assert trees == 3
    row = only(rows, "blocks.{2..39}.attn1", "'2' is not a submodule of 'ModuleList'")
    assert row.configs == ("helios", "helios_amplify") and "resolves on the default config" in row.reason
    only(rows, "blocks.{0..39}.attn1/attn2/ffn", "fits exactly 40 blocks", "warning")
    assert not [row for row in rows if row.plan == "spec cp_plan"]
    helios_plan = diffusers.HeliosTransformer3DModel._cp_plan
    more = plan_checks.check_cp_plan(tree("helios", num_layers=41), "_cp_plan", helios_plan)
    assert {row.key for row in errors(more)} == {"blocks.40.attn1", "blocks.40.attn2", "blocks.40.ffn"}
    only(more, "blocks.40.attn1", "split by 'blocks.*.attn1' with no gather after it")


def test_class_that_cannot_be_built_is_a_row(monkeypatch):
    monkeypatch.setitem(SPECS, "flux", dataclasses.replace(SPECS["flux"], config={"no_such_argument": 1}))
    rows, trees = plan_checks.check_all([Flux])
    assert trees == 1  # the default config still builds and is checked
    row = only(rows, "(whole plan)", "could not build, plans not checked: TypeError", "warning")
    assert row.configs == ("flux",)


def test_class_without_spec_is_checked_on_its_default_config(monkeypatch):
    monkeypatch.delitem(SPECS, "flux")
    rows, trees = plan_checks.check_all([Flux])
    assert trees == 1
    assert {row.plan for row in rows if row.severity == "info"} == {"_cp_plan", "_tp_plan"}


@pytest.mark.parametrize("name", [name for name, spec in SPECS.items()
                                  if getattr(diffusers, spec.class_name)._cp_plan is not None])
def test_cp_keys_resolve_like_diffusers(name):
    """The checker's resolution is a mirror of diffusers' `_get_submodule_by_name`: same modules, same failures."""
    from diffusers.hooks.context_parallel import _get_submodule_by_name

    built = tree(name)
    for key in getattr(diffusers, SPECS[name].class_name)._cp_plan:
        try:
            expected = _get_submodule_by_name(built.model, key)
        except ValueError as error:
            with pytest.raises(ValueError, match=re.escape(str(error))):
                plan_checks.resolve_cp_key(built, key)
            continue
        expected = expected if isinstance(expected, list) else [expected]
        assert [built.modules[path] for path in plan_checks.resolve_cp_key(built, key)] == expected


@pytest.mark.parametrize("name", [name for name, spec in SPECS.items()
                                  if getattr(diffusers, spec.class_name)._tp_plan is not None])
def test_tp_keys_resolve_like_diffusers(name):
    from diffusers.hooks.tensor_parallel import _resolve_tp_plan

    built = tree(name)
    plan = getattr(diffusers, SPECS[name].class_name)._tp_plan
    expected = [(block, sorted(relative)) for block, relative in _resolve_tp_plan(built.model, plan)]
    found: dict[str, list[str]] = {}
    for key in plan:
        for block, path in plan_checks.resolve_tp_key(built, key):
            found.setdefault(block, []).append(path[len(block) + 1:] if block else path)
    assert [(built.modules[block], sorted(paths)) for block, paths in found.items()] == expected


@pytest.mark.parametrize("name", [name for name, spec in SPECS.items()
                                  if spec.cp_plan or getattr(diffusers, spec.class_name)._cp_plan is not None])
def test_split_region_by_registration_order_matches_execution(name):
    """The static split region places modules in registration order; on every zoo model an attention module is
    inside it exactly when it runs between a split and its gather in a real forward."""
    spec = SPECS[name]
    plan = spec.context_parallel_plan() or spec.model_class()._cp_plan
    model = spec.build()
    static = plan_checks.tree_of(model, name)
    hooks = plan_checks.cp_hooks(static, plan)
    clock, entered, left = [0], {}, {}

    def record(store, name):
        def hook(*_):
            clock[0] += 1
            store.setdefault(name, clock[0]) if store is entered else store.__setitem__(name, clock[0])
        return hook

    for path, module in model.named_modules():
        module.register_forward_pre_hook(record(entered, path))
        module.register_forward_hook(record(left, path))
    with torch.no_grad():
        model(**spec.inputs())
    ran = [dataclasses.replace(hook, at=entered[hook.path] if hook.kind == "split" else left[hook.path])
           for hook in hooks]
    attention = [path for path, module in static.modules.items() if isinstance(module, plan_checks.attention_classes())]
    assert attention and all(path in entered for path in attention)

    def inside(regions, at):
        return any(start <= at <= end for start, end in regions)

    by_registration = {path: inside(plan_checks.split_regions(hooks), static.enter(path)) for path in attention}
    by_execution = {path: inside(plan_checks.split_regions(ran), entered[path]) for path in attention}
    assert by_registration == by_execution


def test_models_check_runs_over_every_class(capsys):
    code = cli.main(["models", "--check"])
    out = capsys.readouterr().out
    classes = parallel_classes()
    assert f"plan checks: {len(classes)} classes" in out
    assert code == (1 if int(re.search(r"(\d+) error", out).group(1)) else 0)
    table = out.split("plan checks:")[0].split("have a spec")[1]
    assert all(len(line) <= 120 for line in table.splitlines())
