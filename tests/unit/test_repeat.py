"""Repeat determinism (harness.engine.repeat, harness.run.repeats): a case run twice in one launch must end bit for
bit alike on every rank; its figure is 0 where it does, and a check fails a layout whose ranks do not repeat
themselves, naming the rank and the first module that differed. The deliberate bug (`nondeterministic:<module>`, rank
1's module moving a little more at every call) is a control of `harness selftest` (test_negative_controls); here the
judge, the bitwise comparison, and a declared non-deterministic backend."""

from __future__ import annotations

import torch

from harness.core.figures import REPEAT, with_role
from harness.core.results import CaseResult, Status
from harness.engine.repeat import _difference
from harness.run import repeats
from harness.run.divergence import first_divergence


def _case(backend: str = "native") -> CaseResult:
    return CaseResult(f"flux/ulysses2/{backend}/fp32/tensor", "flux", "default", "tensor", "ulysses2", 2, backend,
                      "fp32", Status.PASS)


def test_bit_for_bit_is_zero_and_any_difference_shows():
    first = torch.randn(64)
    assert _difference(first, first.clone()) == 0.0
    nudged = first.clone()
    nudged[3] = torch.nextafter(nudged[3], torch.tensor(10.0))
    assert 0.0 < _difference(first, nudged) < 1e-6
    assert _difference(first, first[:3]) == float("inf")
    nan = torch.full((3,), float("nan"))
    assert _difference(nan, nan.clone()) == 0.0 and _difference(nan, torch.zeros(3)) == float("inf")


def test_a_repeatable_case_shows_its_figure_and_passes():
    result = _case()
    assert repeats.judge(result, {"repeat": {"max_abs": 0.0, "ranks": [0.0, 0.0], "module": None}}, "native") == []
    figure = with_role(result.figures, REPEAT)
    assert (figure["value"], figure["limit"]) == (0.0, 0.0) and figure["derived"].startswith("bit for bit")
    assert repeats.judge(_case(), {"repeat": None}, "native") == []  # not checked (a compiled case, a flow)


def test_a_case_that_does_not_repeat_itself_fails_naming_the_rank_and_the_module():
    result = _case()
    module = "rank 1: transformer_blocks.0.attn: rel err 1.8e-06 > 1.0e-14 (previous 0.0e+00)"
    found = repeats.judge(result, {"repeat": {"max_abs": 1.2e-7, "ranks": [0.0, 1.2e-7], "module": module}},
                          "native")
    assert [item.check for item in found] == ["repeat"] and found[0].subject == "rank 1"
    assert found[0].text == ("not repeatable: run twice in one launch, rank(s) 1 differ by 1.2e-07 > 0 (bit for "
                             f"bit: the same case run twice in one launch); first at {module}")
    result.evidence = [item.to_dict() for item in found]
    from harness.core.records import Localization, ModuleTrace

    located = first_divergence(result, Localization(ModuleTrace([], None, None), summary="none: every module within "
                                                                                        "its limit"))
    assert located == f"does not repeat itself; first at {module}"


def test_a_declared_non_deterministic_backend_is_held_to_its_band_and_says_why():
    result = _case("_native_efficient")
    assert repeats.judge(result, {"repeat": {"max_abs": 3e-7, "ranks": [3e-7, 0.0], "module": None}},
                         "_native_efficient") == []
    figure = with_role(result.figures, REPEAT)
    assert figure["value"] == 3e-7 and figure["derived"].startswith("declared non-deterministic: PyTorch's "
                                                                    "memory-efficient SDPA backward")
    beyond = repeats.judge(_case("_native_efficient"), {"repeat": {"max_abs": 1e-3, "ranks": [1e-3, 0.0]}},
                           "_native_efficient")
    assert beyond and beyond[0].limit == repeats.NONDETERMINISTIC["_native_efficient"][1]


def test_a_second_run_that_failed_cannot_be_judged_as_repeatable():
    found = repeats.judge(_case(), {"repeat": {"max_abs": None, "ranks": [0.0, "the second run failed: boom"]}},
                          "native")
    assert found[0].text == "cannot tell whether it repeats: rank 1: the second run failed: boom"


def test_a_case_run_on_one_rank_repeats_itself_bit_for_bit():
    from pathlib import Path

    from harness.core.layouts import parse_layout
    from harness.core.records import Case
    from harness.engine.casework import run_case
    from harness.engine.context import RankContext
    from harness.rank import backends

    backends.install_dispatch_counters()
    context = RankContext(Path(__file__).resolve().parents[2] / "references", None, torch.device("cpu"))
    _, info = run_case(context, Case("flux", parse_layout("single"), "native", "fp32"))
    assert info["repeat"]["max_abs"] == 0.0 and info["repeat"]["ranks"] == [0.0] and info["repeat"]["module"] is None
    _, compiled = run_case(context, Case("flux", parse_layout("single"), "native", "fp32", mode="aot_eager"))
    assert compiled["repeat"] is None  # eager cases only
