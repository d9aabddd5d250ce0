"""Reference files: atomic, never silently overwritten, and every kind of damage is a clear error."""

import re

import pytest
import torch

from harness.core.errors import HarnessError
from harness.core.reference import read_meta, read_reference, reference_path, write_reference

# every damaged reference says how to capture exactly it again
FIX_RE = re.escape("recapture just this file with "
                   "`harness capture --models toy --kinds tensor --shapes default --force`")


def _write(path, value=1.0, force=False, **meta):
    weights = {"layer.weight": torch.full((3, 3), value)}
    inputs = {"hidden_states": torch.arange(6.0).reshape(1, 2, 3), "img_shapes": [(1, 2, 3)], "steps": 4}
    return write_reference(path, weights, inputs, torch.ones(1, 2, 3) * value, {"config_hash": "abc", **meta},
                           force=force)


def test_round_trip_keeps_tensors_and_static_inputs(tmp_path):
    path = reference_path(tmp_path, "toy")
    assert _write(path)
    reference = read_reference(path, expected_config_hash="abc")
    assert torch.equal(reference.weights["layer.weight"], torch.ones(3, 3))
    assert reference.inputs["img_shapes"] == [(1, 2, 3)]  # tuples survive the JSON header
    assert reference.inputs["steps"] == 4
    assert reference.meta["schema"] == 1


def test_existing_reference_is_kept_unless_forced(tmp_path):
    path = reference_path(tmp_path, "toy")
    assert _write(path, 1.0)
    assert not _write(path, 2.0)
    assert read_reference(path).output.max() == 1.0
    assert _write(path, 2.0, force=True)
    assert read_reference(path).output.max() == 2.0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_missing_reference_says_how_to_create_it(tmp_path):
    with pytest.raises(HarnessError, match=f"missing reference {re.escape(str(tmp_path))}/none.safetensors: run "
                                           "`harness capture` or `pytest --ref`"):
        read_reference(tmp_path / "none.safetensors")


def test_truncated_file_is_a_clear_error(tmp_path):
    path = reference_path(tmp_path, "toy")
    _write(path)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(HarnessError, match=f"{re.escape(str(path))} is unreadable .*{FIX_RE}"):
        read_reference(path)


def test_empty_file_is_a_clear_error(tmp_path):
    path = reference_path(tmp_path, "toy")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    with pytest.raises(HarnessError, match=f"{re.escape(str(path))} is unreadable .*{FIX_RE}"):
        read_reference(path)


def test_flipped_byte_fails_the_checksum(tmp_path):
    path = reference_path(tmp_path, "toy")
    _write(path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's data
    path.write_bytes(bytes(data))
    with pytest.raises(HarnessError, match=f"{re.escape(str(path))} failed its checksum .*{FIX_RE}"):
        read_reference(path)


def test_newer_schema_is_refused(tmp_path, rewrite_meta):
    path = reference_path(tmp_path, "toy")
    _write(path)
    rewrite_meta(path, lambda meta: meta.update(schema=99))
    with pytest.raises(HarnessError, match=f"{re.escape(str(path))} has schema 99, newer than this harness .*; "
                                           "upgrade the harness or recapture with this one"):
        read_meta(path)


def test_flipped_bit_in_the_metadata_is_a_clear_error(tmp_path):
    path = reference_path(tmp_path, "toy")
    _write(path)
    data = path.read_bytes()
    colon = data.index(b'\\"checksum\\":') + len(b'\\"checksum\\"')  # in the harness metadata's JSON text
    path.write_bytes(data[:colon] + b";" + data[colon + 1:])  # ':' -> ';' (one bit): still valid safetensors
    with pytest.raises(HarnessError, match=f"{re.escape(str(path))}.*{FIX_RE}"):
        read_meta(path)


def test_config_mismatch_names_the_file(tmp_path):
    path = reference_path(tmp_path, "toy")
    _write(path)
    with pytest.raises(HarnessError, match=f"{re.escape(str(path))} was captured from another config .*{FIX_RE}"):
        read_reference(path, expected_config_hash="different")


def test_foreign_safetensors_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = reference_path(tmp_path, "toy")
    path.parent.mkdir(parents=True)
    save_file({"x": torch.zeros(2)}, str(path))
    with pytest.raises(HarnessError, match=f"{re.escape(str(path))} is not a harness reference .*{FIX_RE}"):
        read_reference(path)


def test_a_damaged_committed_reference_says_to_restore_it_from_git(tmp_path):
    """`--force` on every reference would churn committed binaries: restoring the one file is the fix."""
    import subprocess

    path = reference_path(tmp_path, "toy", "txt7")
    _write(path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(HarnessError) as raised:
        read_reference(path)
    assert str(raised.value).endswith(
        f"restore the committed file with `git checkout -- {path}`, or recapture just it with "
        "`harness capture --models toy --kinds tensor --shapes txt7 --force`")


def test_a_forced_recapture_keeps_a_file_it_reproduces_and_says_why_it_does_not(tmp_path):
    """Two fp32 captures differ by ~2e-7 (where tensors land in memory): within REPRODUCIBLE the file stays as it
    was; another output, another weight, or other versions rewrite it and say which."""
    import torch

    from harness.core.reference import REPRODUCIBLE, recapture_difference, reference_meta, write_reference

    path = tmp_path / "x.safetensors"
    weights, inputs = {"w": torch.ones(3)}, {"x": torch.zeros(2)}
    meta = reference_meta("m", "default", "tensor", {}, "h")
    assert write_reference(path, weights, inputs, torch.ones(4), meta)
    before = path.read_bytes()
    assert not write_reference(path, weights, inputs, torch.ones(4) + REPRODUCIBLE / 2, meta, force=True)
    assert path.read_bytes() == before
    assert write_reference(path, weights, inputs, torch.ones(4) + 10 * REPRODUCIBLE, meta, force=True)
    assert path.read_bytes() != before
    tensors = {"weights.w": torch.ones(3) * 2, "inputs.x": torch.zeros(2), "output": torch.ones(4)}
    header = {"x": 1}
    assert "metadata differs" in recapture_difference(path, tensors, header)


def _modules():
    from harness.core.reference import ModuleRecord

    values = torch.arange(12.0, dtype=torch.float64).reshape(2, 6)
    return ModuleRecord({"forward": (["a", "b"], values)}, {"platform": {"torch": "x"}, "projections": 4})


def test_module_fingerprints_travel_in_the_same_file_under_its_checksum(tmp_path):
    path = reference_path(tmp_path, "toy")
    weights = {"layer.weight": torch.ones(3, 3)}
    assert write_reference(path, weights, {}, torch.ones(2), {"config_hash": "abc"}, modules=_modules())
    reference = read_reference(path, expected_config_hash="abc")
    names, values = reference.modules["forward"]
    assert names == ["a", "b"] and torch.equal(values, _modules().parts["forward"][1])
    assert reference.modules_about == {"platform": {"torch": "x"}, "projections": 4}
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # the fingerprints are the last tensor ("modules.forward" sorts last)
    path.write_bytes(bytes(data))
    with pytest.raises(HarnessError, match="failed its checksum"):
        read_reference(path)


def test_fingerprints_whose_names_do_not_match_are_a_damaged_file(tmp_path, rewrite_meta):
    path = reference_path(tmp_path, "toy")
    write_reference(path, {"w": torch.ones(1)}, {}, torch.ones(2), {"config_hash": "abc"}, modules=_modules())
    rewrite_meta(path, lambda meta: meta["modules"]["names"].update(forward=["a"]))
    with pytest.raises(HarnessError, match=f"has damaged module fingerprints .*{FIX_RE}"):
        read_reference(path)


def test_a_reference_written_before_fingerprints_still_reads_with_none(tmp_path):
    path = reference_path(tmp_path, "toy")
    _write(path)
    reference = read_reference(path)
    assert reference.modules == {} and reference.modules_about == {}
