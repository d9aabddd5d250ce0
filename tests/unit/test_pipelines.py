"""The tiny pipelines build from local configs only, run in well under a second or two, and are reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.catalogue.pipelines import MODELS, build_pipeline, common, recipe, run_pipeline, transformer_of
from harness.core.errors import HarnessError

pytest.importorskip("transformers", reason="diffusers' pipeline classes need the transformers package")

SHAPES = {"flux": (64, 64, 3), "flux2": (64, 64, 3), "qwenimage": (64, 64, 3), "wan": (5, 64, 64, 3)}


@pytest.fixture(scope="module")
def fp32_pipelines():
    return {name: build_pipeline(name, torch.float32) for name in MODELS}


def test_every_model_has_a_recipe():
    assert set(MODELS) == set(SHAPES)
    with pytest.raises(HarnessError, match="no tiny pipeline"):
        recipe("nope")


@pytest.mark.parametrize("name", MODELS)
def test_runs_with_the_right_shape_and_range(fp32_pipelines, name):
    image = run_pipeline(fp32_pipelines[name], name)
    assert image.shape == SHAPES[name] and image.dtype == np.float32
    assert np.isfinite(image).all() and image.min() >= 0.0 and image.max() <= 1.0
    # Structured, with contrast (see CONTRAST in each recipe), and almost nothing clipped to black or white.
    assert 0.08 < image.std() < 0.25
    assert np.mean((image <= 0.0) | (image >= 1.0)) < 0.02


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_picture_other_seed_other_picture(fp32_pipelines, name):
    pipe = fp32_pipelines[name]
    first, again = run_pipeline(pipe, name), run_pipeline(pipe, name)
    assert np.array_equal(first, again)
    assert np.array_equal(first, run_pipeline(build_pipeline(name, torch.float32), name))  # rebuilt: same weights
    assert not np.allclose(first, run_pipeline(pipe, name, seed=common.LATENT_SEED + 1), atol=1e-3)


@pytest.mark.parametrize("name", MODELS)
def test_bf16_casts_like_from_pretrained(name):
    pipe = build_pipeline(name, torch.bfloat16)
    transformer = transformer_of(pipe)
    assert transformer is pipe.transformer
    keep = getattr(transformer, "_keep_in_fp32_modules", None) or []
    for param_name, param in transformer.named_parameters():
        kept = any(part in keep for part in param_name.split("."))
        assert param.dtype == (torch.float32 if kept else torch.bfloat16), param_name
    assert all(p.dtype == torch.bfloat16 for p in pipe.vae.parameters())
    image = run_pipeline(pipe, name)
    assert image.shape == SHAPES[name] and np.isfinite(image).all()


def test_sharpening_is_part_of_the_seeded_weights():
    """Building twice gives bit-identical weights, and they are the sharpened ones (QK norms x QK_GAIN)."""
    first, second = (transformer_of(build_pipeline("flux")) for _ in range(2))
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert torch.all(first.transformer_blocks[0].attn.norm_q.weight == common.QK_GAIN)


def test_config_hash_tells_recipes_apart_and_is_stable():
    hashes = {name: recipe(name).config_hash() for name in MODELS}
    assert len(set(hashes.values())) == len(MODELS)
    assert all(recipe(name).config_hash() == value for name, value in hashes.items())
