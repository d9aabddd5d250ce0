"""Per-module fingerprints (harness.rank.fingerprint) and where one run first left another's (harness.rank.moved), on
small modules in one process. What the references hold is in test_reference; the faults every device shares, named
at their module, in test_negative_controls and `harness selftest --localize`."""

from __future__ import annotations

import torch

from harness.rank import fingerprint, moved


def test_equal_outputs_give_equal_fingerprints_and_any_change_shows():
    tensor = torch.randn(3, 64, 16, generator=torch.Generator().manual_seed(1))
    same = fingerprint.fingerprint(tensor.clone())
    assert fingerprint.difference(fingerprint.fingerprint(tensor), same) == 0.0
    one_ulp = tensor.clone()
    one_ulp.view(-1)[100] = torch.nextafter(one_ulp.view(-1)[100], torch.tensor(10.0))
    assert fingerprint.difference(fingerprint.fingerprint(one_ulp), same) > fingerprint.RESOLUTION
    scaled = fingerprint.difference(fingerprint.fingerprint(tensor * (1 + 1e-3)), same)
    assert 1e-4 < scaled < 1e-2  # about the relative change, whatever the tensor's size
    assert fingerprint.difference(fingerprint.fingerprint(tensor * float("nan")), same) == float("inf")


def test_a_fingerprint_is_small_and_the_same_on_every_run():
    tensor = torch.randn(1000)
    found = fingerprint.fingerprint(tensor)
    assert found.shape == (fingerprint.WIDTH,) and found.dtype == torch.float64
    fingerprint._BASES.clear()  # drawn again from its seed: the same basis
    assert torch.equal(fingerprint.fingerprint(tensor), found)


class _Block(torch.nn.Module):
    def __init__(self, shift: float = 0.0):
        super().__init__()
        self.inner, self.out, self.shift = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), shift

    def forward(self, x):
        return self.out(self.inner(x) + self.shift)  # code between its children, as an attention processor's


def _model(shift: float = 0.0, scale_first: float = 1.0) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), _Block(shift), torch.nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight.mul_(scale_first)
    return model


def _record(model, loss=False):
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    if loss:
        return fingerprint.record(model, None, lambda: model(x).square().mean())[0].parts()
    return fingerprint.record(model, lambda: model(x))[0].parts()


def test_modules_are_recorded_in_the_order_they_finish_with_their_inputs_and_the_whole_output_last():
    parts = _record(_model())
    assert parts["forward"][0] == ["0", "1.inner", "1.out", "1", "2", fingerprint.OUTPUT]
    assert parts["forward_in"][0] == parts["forward"][0] and parts["forward"][1].shape == (6, fingerprint.WIDTH)
    both = _record(_model(), loss=True)
    assert both["backward"][0] == ["2", "1.out", "1.inner", "1"]  # "0" hands nothing on: its input needs no grad


def _limit(_part, _name):
    return fingerprint.RESOLUTION


def test_the_first_module_that_moved_is_named_with_the_one_before():
    traces = moved.compare(_record(_model()), _record(_model(scale_first=1 + 2**-20)), _limit)
    assert traces["forward"].line.startswith("0: rel err ")
    assert moved.summary(traces).startswith("0: rel err")
    clean = moved.compare(_record(_model()), _record(_model()), _limit)
    assert moved.summary(clean) == "none: every module within its limit"
    assert moved.worst(clean)["error"] == 0.0


def test_a_change_between_children_is_named_as_the_module_around_them():
    traces = moved.compare(_record(_model()), _record(_model(shift=1e-6)), _limit)
    assert traces["forward"].line.startswith("1 (first seen at its out): rel err ")
    assert "(previous 0.0e+00)" in traces["forward"].line


def test_the_backward_is_compared_in_backward_order():
    stored = _record(_model(), loss=True)
    found = moved.compare(stored, _record(_model(), loss=True), _limit)
    assert found["backward"].line is None and moved.summary(found).startswith("none")
    changed = moved.compare(stored, _record(_model(scale_first=1.001), loss=True), _limit)
    assert changed["forward"].line.startswith("0: ")


def test_a_module_the_reference_did_not_run_is_said_not_compared():
    stored = _record(_model())
    stored = {part: (names[1:], values[1:]) for part, (names, values) in stored.items()}
    traces = moved.compare(stored, _record(_model()), _limit)
    assert traces["forward"].uncompared == ["0"]
    assert moved.summary(traces).startswith("none within the 5 compared module outputs; 1 not compared (0)")


def test_a_capture_sums_on_the_threads_a_rank_computes_with(monkeypatch):
    from harness.core import determinism

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with determinism.as_a_rank_computes():
            assert torch.get_num_threads() == 1 and fingerprint.platform()["threads"] == "1"
        assert torch.get_num_threads() == 2  # the capturing process's own count again
    finally:
        torch.set_num_threads(before)
