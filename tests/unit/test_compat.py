"""The supported diffusers releases: the minimum, the feature probes, and what a missing feature becomes (a SKIP)."""

import re

import pytest
import torch
from packaging.version import Version

from harness.core import compat
from harness.core.errors import HarnessError
from harness.core.layouts import parse_layout


@pytest.fixture
def lacking(monkeypatch):
    """Pretend the installed diffusers (called 0.38.0) has every feature but the named ones."""

    def pretend(*names):
        monkeypatch.setattr(compat, "has", lambda name: name not in names)
        monkeypatch.setattr(compat, "installed_version", lambda: "0.38.0")

    return pretend


@pytest.mark.parametrize("version", ["0.35.2", "0.30.0", "0.36.0rc1"])
def test_an_older_diffusers_is_refused_with_both_versions(version):
    expected = rf"diffusers {version} is installed; the harness needs diffusers >= 0\.36\.0"
    with pytest.raises(HarnessError, match=expected):
        compat.check_supported(version)


@pytest.mark.parametrize("version", ["0.36.0", "0.38.0", "0.42.1", "0.43.0.dev0"])
def test_supported_releases_pass(version):
    compat.check_supported(version)


def test_an_unreadable_version_is_a_clear_error():
    with pytest.raises(HarnessError, match="cannot read the installed diffusers version 'main'"):
        compat.check_supported("main")


@pytest.mark.parametrize("name", sorted(compat.FEATURES))
def test_each_probe_agrees_with_the_release_that_introduced_it(name):
    """On whichever diffusers is installed: the probe (an attribute, a field, a signature) finds the feature exactly
    from the release FEATURES names, so the SKIP reasons tell the truth."""
    expected = Version(compat.installed_version()).release >= Version(compat.FEATURES[name].since).release
    assert compat.has(name) is expected


def test_an_unknown_feature_is_an_error():
    with pytest.raises(HarnessError, match="unknown diffusers feature 'warp_drive'"):
        compat.has("warp_drive")


@pytest.mark.parametrize(
    ("layout", "lacks", "reason"),
    [
        ("tp2", ["tensor_parallel"], "tensor parallelism needs diffusers >= 0.40 (installed 0.38.0)"),
        ("tp2+ulysses2", ["parallel_config_tp"], "ParallelConfig(tensor_parallel_config=...) needs diffusers >= 0.40"),
        ("ulysses2any", ["ulysses_anything"], "ulysses_anything needs diffusers >= 0.37 (installed 0.38.0)"),
        ("ring2any", ["ring_anything"], "ring_anything needs diffusers >= 0.38 (installed 0.38.0)"),
        ("ring2xulysses2", ["unified_ring_ulysses"], "ring and Ulysses combined (ringRxulyssesU) needs diffusers"),
        ("ring2", ["tensor_parallel", "ring_anything", "unified_ring_ulysses"], None),
    ],
)
def test_a_missing_feature_is_a_plan_time_skip(lacking, layout, lacks, reason):
    from harness.run.plan import build_plan

    lacking(*lacks)
    assert (compat.layout_missing(parse_layout(layout)) or "").startswith(reason or "")
    assert (compat.layout_missing(parse_layout(layout)) is None) is (reason is None)
    planned = build_plan(["flux"], [layout], ["native"], ["fp32"], cpu_max_ranks=4)
    if reason is not None:
        assert planned[0].skip_reason.startswith(reason)
        with pytest.raises(HarnessError, match=re.escape(f"layout {layout}: {reason}")):  # never another layout
            parse_layout(layout).diffusers_config()


def test_a_class_the_release_lacks_is_a_skip_not_a_crash(monkeypatch):
    from dataclasses import replace

    from harness.catalogue.zoo import get_spec
    from harness.run import plan

    monkeypatch.setattr(compat, "installed_version", lambda: "0.36.0")
    monkeypatch.setattr(plan, "get_spec", lambda name: replace(get_spec(name), class_name="NoSuchTransformer2DModel"))
    assert plan.skip_reason(_case("flux", "ulysses2"), 4) == "diffusers 0.36.0 has no NoSuchTransformer2DModel"


def test_mesh_is_passed_only_where_contextparallelconfig_takes_it(lacking):
    mesh = object()
    if compat.has("cp_mesh"):
        assert parse_layout("ulysses2").diffusers_config(mesh).mesh is mesh
    lacking("cp_mesh")
    assert getattr(parse_layout("ulysses2").diffusers_config(mesh), "mesh", None) is None  # diffusers builds one


def test_qwenimage_is_called_as_036s_pipeline_calls_it_only_where_needed(lacking):
    from diffusers import QwenImageTransformer2DModel

    from harness.catalogue.zoo import get_spec
    from harness.catalogue.zoo.qwenimage import with_036_call

    if compat.has("qwenimage_txt_seq_lens_optional"):  # 0.37 on: the class itself, nothing filled in
        assert get_spec("qwenimage").model_class() is QwenImageTransformer2DModel

    class Recorder:
        _cp_plan = {"": {"encoder_hidden_states_mask": "split"}}

        def __call__(self, *args, **kwargs):
            return kwargs

    text = torch.zeros(2, 7, 4)
    lacking()
    assert with_036_call(Recorder)()(encoder_hidden_states=text) == {"encoder_hidden_states": text,
                                                                     "encoder_hidden_states_mask": None}
    lacking("qwenimage_txt_seq_lens_optional")
    filled = with_036_call(Recorder)()
    assert filled(encoder_hidden_states=text)["txt_seq_lens"] == [7, 7]  # the whole text, before any split
    assert filled(encoder_hidden_states=text, txt_seq_lens=[5, 3])["txt_seq_lens"] == [5, 3]
    mask = torch.ones(2, 7)
    assert filled(encoder_hidden_states=text, encoder_hidden_states_mask=mask)["encoder_hidden_states_mask"] is mask
    assert type(filled).__name__ == "Recorder" and isinstance(filled, Recorder)
    Recorder._cp_plan = {"transformer_blocks.0": {}}
    assert "encoder_hidden_states_mask" not in with_036_call(Recorder)()(encoder_hidden_states=text)


def _case(model, layout):
    from harness.core.records import Case

    return Case(model, parse_layout(layout), "native", "fp32")


def test_the_package_requirement_names_the_same_minimum():
    """pip's requirement cannot import harness.core.compat; this keeps the two statements of the minimum equal."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert f"diffusers>={compat.MIN_DIFFUSERS}" in project["dependencies"]
