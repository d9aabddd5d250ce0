"""The tiny zoo: every diffusers class with a parallel plan is covered, and every spec runs on every shape."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.catalogue.zoo import NOT_COVERED, SPECS, Shape
from harness.catalogue.zoo.discover import parallel_classes

SPEC_SHAPES = [(name, shape) for name, spec in SPECS.items() for shape in spec.shapes]
MASKED = [(name, shape) for name, shape in SPEC_SHAPES if SPECS[name].shapes[shape].masked]


@pytest.fixture(scope="module")
def models():
    """One seeded model per spec, built once: building dominates the cost, forwards take milliseconds."""
    return {name: spec.build() for name, spec in SPECS.items()}


def forward(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def test_every_parallel_class_has_a_spec_or_a_reason():
    classes = parallel_classes()
    assert classes, "discovery found no class with _cp_plan or _tp_plan: the walk of diffusers is broken"
    uncovered = [row["class_name"] for row in classes if row["spec"] is None and row["class_name"] not in NOT_COVERED]
    assert not uncovered, f"add a spec under harness/catalogue/zoo/ or a NOT_COVERED reason for: {uncovered}"
    assert all(reason.strip() for reason in NOT_COVERED.values())


def test_discovery_rows_describe_the_class():
    import diffusers

    for row in parallel_classes():
        cls = getattr(diffusers, row["class_name"])
        assert row["has_cp_plan"] == (cls._cp_plan is not None)
        assert row["has_tp_plan"] == (cls._tp_plan is not None)
        assert row["has_cp_plan"] or row["has_tp_plan"]
        if row["spec"] is not None:
            assert SPECS[row["spec"]].class_name == row["class_name"]


def test_every_spec_targets_a_discovered_class():
    discovered = {row["class_name"] for row in parallel_classes()}
    assert {spec.class_name for spec in SPECS.values()} <= discovered


def test_shape_names_match_keys_and_default_divides_by_four():
    for spec in SPECS.values():
        assert "default" in spec.shapes
        assert all(shape.name == key for key, shape in spec.shapes.items())
        default = spec.shapes["default"]
        assert default.image_tokens % 4 == 0 and default.text % 4 == 0


@pytest.mark.parametrize(("name", "shape"), SPEC_SHAPES, ids=[f"{n}@{s}" for n, s in SPEC_SHAPES])
def test_spec_runs_single_device(models, name, shape):
    spec = SPECS[name]
    inputs = spec.inputs(shape)
    output = forward(models[name], inputs)
    assert torch.isfinite(output).all()
    assert output.shape[0] == 1
    assert output.numel() > 0
    again = forward(models[name], spec.inputs(shape))
    assert torch.equal(output, again), "inputs must be deterministic: the same seed gives the same output"


@pytest.mark.parametrize(("name", "shape"), SPEC_SHAPES, ids=[f"{n}@{s}" for n, s in SPEC_SHAPES])
def test_inputs_survive_the_reference_file(models, name, shape, tmp_path):
    """Workers run from the stored inputs: tensors must save (no shared memory) and the rest must round-trip JSON."""
    from harness.core.reference import read_reference, write_reference

    spec = SPECS[name]
    inputs = spec.inputs(shape)
    output = forward(models[name], inputs)
    path = tmp_path / "ref.safetensors"
    write_reference(path, {}, inputs, output, {"config_hash": spec.config_hash()})
    stored = read_reference(path, spec.config_hash()).inputs
    assert set(stored) == set(inputs)
    # Cloned: tensors read from the file may sit at unaligned addresses, which moves CPU kernels' SIMD rounding
    # by ~2e-7; the values themselves must round-trip exactly.
    stored = {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in stored.items()}
    assert torch.equal(forward(models[name], stored), output)


@pytest.mark.parametrize(("name", "shape"), MASKED, ids=[f"{n}@{s}" for n, s in MASKED])
def test_masked_shapes_depend_on_the_mask(models, name, shape):
    """A layout that drops the mask must be far off, or the "masked" shape checks nothing.

    1e-3 is 100x the fp32 tolerance; measured: qwenimage 1.1e-2 (its text RMSNorm flattens the large padding),
    qwenimage21 5.3e-2, ltx 1.5, ltx2 0.93.
    """
    inputs = SPECS[name].inputs(shape)
    mask_keys = [key for key, value in inputs.items() if "mask" in key and key != "img_mask" and value is not None]
    assert mask_keys, f"{name}@{shape} passes no text mask"
    masked = forward(models[name], inputs)
    unmasked = forward(models[name], {**inputs, **{key: None for key in mask_keys}})
    assert (masked - unmasked).abs().max() > 1e-3


def test_config_hash_tracks_config_and_shapes():
    spec = SPECS["flux"]
    changed_config = dataclasses.replace(spec, config={**spec.config, "num_layers": 2})
    changed_shapes = dataclasses.replace(spec, shapes={**spec.shapes, "extra": Shape("extra", text=5)})
    hashes = {spec.config_hash(), changed_config.config_hash(), changed_shapes.config_hash()}
    assert len(hashes) == 3
    assert spec.config_hash() == dataclasses.replace(spec).config_hash()


def test_shape_is_frozen_and_hashable():
    shape = Shape("x", options=("isolate_modalities",))
    assert hash(shape) == hash(Shape("x", options=("isolate_modalities",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.text = 3  # type: ignore[misc]


def test_helios_cp_plan_names_only_built_blocks():
    spec = SPECS["helios"]
    plan = spec.context_parallel_plan()
    model_blocks = spec.config["num_layers"]
    indices = {int(key.split(".")[1]) for key in plan if key.startswith("blocks.") and key.split(".")[1].isdigit()}
    assert indices == set(range(model_blocks))
    assert "blocks.*.attn1" in plan
    others = [spec for spec in SPECS.values() if spec.class_name != "HeliosTransformer3DModel"]
    assert all(spec.context_parallel_plan() is None for spec in others)
