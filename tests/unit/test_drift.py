"""One device held to its stored reference by the reference's own noise (harness.engine.drift), in one process on
references captured here: on their own platform a clean run moves no module at all, and a change every device shares
(harness.faults.model) is named at the module it changes, however far inside the layouts' tolerance; on another
platform the limit is this one's rounding noise, and says so."""

from __future__ import annotations

import pytest
import torch

from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.engine import drift
from harness.engine.context import RankContext
from harness.kinds import kind_of
from harness.rank import fingerprint


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    root = tmp_path_factory.mktemp("references")
    kind_of("tensor").capture("flux", "default", root)
    kind_of("train").capture("flux", "default", root, steps=1)
    return root


@pytest.fixture(autouse=True)
def fresh():
    drift._KEPT.clear()


def _of(references, fault=None, kind="tensor", layout="ulysses2") -> dict:
    case = Case("flux", parse_layout(layout), "native", "fp32", kind, fault=fault)
    return drift.of(RankContext(references, None, torch.device("cpu")), None, case)


def test_a_clean_run_moves_no_module_on_the_platform_that_captured_it(references):
    found = _of(references)
    assert found["line"] == "none: every module within its limit" and found["value"] == 0.0
    assert found["limit"] == fingerprint.RESOLUTION and "bit for bit" in found["derived"]
    assert found["forward"]["modules"][-1]["module"] == fingerprint.OUTPUT


@pytest.mark.parametrize("module", ["transformer_blocks.0.attn.norm_q", "x_embedder", "transformer_blocks.0.ff",
                                    "single_transformer_blocks.0.proj_out"])
def test_a_change_every_device_shares_is_named_at_its_module(references, module):
    found = _of(references, f"shared_scale:{module}")
    assert found["line"].startswith(f"{module}: rel err "), found["line"]
    assert "(previous 0.0e+00)" in found["line"] or module == "x_embedder"


def test_rope_turned_the_other_way_is_named_at_the_attention_it_runs_in(references):
    found = _of(references, "rope_sign")
    assert found["line"].startswith("transformer_blocks.0.attn (first seen at its to_out.0): rel err "), found["line"]


def test_a_backward_only_change_is_named_in_the_backward(references):
    found = _of(references, "shared_grad:transformer_blocks.0.ff", kind="train")
    assert found["forward"]["line"] is None
    assert found["line"].startswith("backward: transformer_blocks.0.ff: rel err "), found["line"]
    assert _of(references, kind="train")["line"] == "none: every module within its limit"


def test_elsewhere_each_module_is_held_to_this_platforms_rounding_noise(references, monkeypatch):
    here = fingerprint.platform()
    monkeypatch.setattr(fingerprint, "platform", lambda: {**here, "cpu_model": "another processor"})
    found = _of(references)
    assert found["derived"].startswith("captured on another platform (cpu_model differ: ")
    assert "x this platform's fp32 rounding noise per module (the nudged:1 draw)" in found["derived"]
    assert found["line"] == "none: every module within its limit" and found["limit"] > fingerprint.RESOLUTION
    assert _of(references, "rope_sign")["line"].startswith("transformer_blocks.0.attn (first seen at its to_out.0)")


def test_other_threads_are_another_platform(references, monkeypatch):
    """A capture sums on a rank's threads; a rank on other threads sums in another order (~1e-7 on some models),
    so its limit is this platform's noise, said as the threads."""
    here = fingerprint.platform()
    assert here["threads"] == str(torch.get_num_threads())
    monkeypatch.setattr(fingerprint, "platform", lambda: {**here, "threads": "7"})
    assert _of(references)["derived"].startswith("captured on another platform (threads differ: ")


def test_a_reference_without_fingerprints_says_it_cannot_be_located(tmp_path):
    from harness.core.reference import read_reference, reference_path, write_reference

    kind_of("tensor").capture("flux", "default", tmp_path)
    path = reference_path(tmp_path, "flux")
    old = read_reference(path)
    write_reference(path, old.weights, old.inputs, old.output, {k: v for k, v in old.meta.items()
                                                                 if k not in ("modules", "schema", "checksum",
                                                                              "static_inputs")}, force=True)
    found = _of(tmp_path)
    assert found["absent"].startswith(f"{path} predates per-module fingerprints")
    assert "harness capture --models flux --kinds tensor --shapes default --force" in found["absent"]
