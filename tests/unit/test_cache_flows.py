"""The cache flows (harness.flows.caches): their declarations, the denoising loop their cases run and what it records
per step, and the judge of every rank's decisions (harness.run.decisions) with its negative controls; one torchrun
launch of 2 ranks for what only real ranks show."""

import contextlib

import pytest
import torch

from harness import flows
from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.core.results import Status
from harness.flows.denoising import Denoising, of_flow
from harness.run import decisions
from harness.run.verdict import base_result

CACHES = ("cache_fbc", "cache_pab", "cache_faster", "cache_taylorseer", "cache_mag", "cache_sea")


def test_every_cache_is_a_flow_in_both_positions_with_its_loop():
    for name in CACHES:
        assert {name, name + "_after"} <= set(flows.VALUES)
        assert flows.REGISTERED[name].steps > 1 and "diffusers.hooks." in flows.REGISTERED[name].needs[0]
    assert of_flow("lora") is None and of_flow("none") is None  # every other flow runs one forward
    assert of_flow("cache_fbc_after").steps == flows.REGISTERED["cache_fbc"].steps


class _Toy(torch.nn.Module):
    """Two linear layers; the second is skipped at the steps in `reused` (as a cache skips a block)."""

    def __init__(self, reused=()):
        super().__init__()
        self.first, self.second, self.reused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), set(reused)
        self.contexts, self.step, self.seen = [], 0, []

    @contextlib.contextmanager
    def cache_context(self, name, **where):
        self.contexts.append((name, where["step_index"], where["sigma"]))
        yield

    def forward(self, hidden_states, timestep, encoder_hidden_states=None):
        self.seen.append(hidden_states.clone())
        out = self.first(hidden_states + (0 if encoder_hidden_states is None else encoder_hidden_states))
        out = out if self.step in self.reused else self.second(out)
        self.step += 1
        return out * timestep


def _loop(model, steps=4, contexts=("cond",), prompt=None):
    loop = Denoising(steps, contexts)
    inputs = {"hidden_states": torch.ones(1, 4), "timestep": torch.ones(1),
              **({} if prompt is None else {"encoder_hidden_states": prompt})}
    return loop, loop.run(model, inputs, lambda module, given: module(**given))


def test_the_loop_counts_what_each_step_computed_inside_its_cache_context():
    loop, _ = _loop(_Toy(reused={2}))
    assert loop.work == [2, 2, 1, 2]
    toy = _Toy()
    loop, _ = _loop(toy)
    assert [name for name, _, _ in toy.contexts] == ["cond"] * 4
    assert [step for _, step, _ in toy.contexts] == [0, 1, 2, 3]
    assert [sigma for _, _, sigma in toy.contexts] == loop.sigmas[:4] and loop.sigmas[0] > loop.sigmas[-1]


class _NameOnly(_Toy):
    """A model of a release before 0.41, whose `cache_context` takes the context's name alone."""

    @contextlib.contextmanager
    def cache_context(self, name):
        self.contexts.append(name)
        yield


def test_a_release_whose_cache_context_takes_the_name_alone_runs_the_same_loop():
    toy = _NameOnly(reused={1})
    loop, _ = _loop(toy)
    assert toy.contexts == ["cond"] * 4 and loop.work == [2, 1, 2, 2]


def test_a_guided_loop_runs_cond_then_uncond_with_the_negative_prompt_and_steps_by_the_guided_output():
    """True CFG as the QwenImage, Wan and Flux pipelines run it: each step, `cond` then `uncond` (the negative
    prompt's embeddings, here the prompt's negated), each in its own cache context and counted apart; the latents move
    by uncond + scale x (cond - uncond)."""
    from harness.flows import denoising

    toy, prompt = _Toy(reused={3}), torch.full((1, 4), 0.5)
    loop, output = _loop(toy, steps=2, contexts=("cond", "uncond"), prompt=prompt)
    assert [name for name, _, _ in toy.contexts] == ["cond", "uncond", "cond", "uncond"]
    assert loop.labels == ["step 0 cond", "step 0 uncond", "step 1 cond", "step 1 uncond"] and loop.work == [2, 2, 2, 1]
    cond, uncond = (toy.second(toy.first(toy.seen[0] + sign * prompt)) * loop.sigmas[0] for sign in (1, -1))
    guided = uncond + denoising.GUIDANCE * (cond - uncond)
    assert torch.allclose(toy.seen[2], toy.seen[0] + (loop.sigmas[1] - loop.sigmas[0]) * guided)
    assert torch.equal(toy.seen[1], toy.seen[0]) and output.shape == (1, 4)


def test_a_model_of_its_own_per_branch_keeps_each_branch_apart():
    """One device's equivalent of a cache that keeps a state per context: the branches run on models of their own,
    counted together."""
    cond, uncond = _Toy(reused={1}), _Toy()
    loop = Denoising(2, ("cond", "uncond"))
    loop.branch_models = {"cond": cond, "uncond": uncond}
    loop.run(_Toy(), {"hidden_states": torch.ones(1, 4), "timestep": torch.ones(1)}, lambda m, given: m(**given))
    assert loop.work == [2, 2, 1, 2] and len(cond.seen) == len(uncond.seen) == 2


def test_each_step_feeds_the_next_latents_by_an_euler_step():
    toy = _Toy()
    loop, _ = _loop(toy, steps=2)
    first_output = toy.second(toy.first(toy.seen[0])) * loop.sigmas[0]
    expected = toy.seen[0] + (loop.sigmas[1] - loop.sigmas[0]) * first_output
    assert torch.allclose(toy.seen[1], expected) and not torch.allclose(toy.seen[1], toy.seen[0])


def _judged(steps):
    result = base_result(Case("flux", parse_layout("ulysses2"), "native", "fp32", flow="cache_fbc"))
    return result, decisions.failures(result, steps)


def test_ranks_that_decided_alike_and_reused_pass_with_their_record():
    result, found = _judged([[28, 22, 28], [28, 22, 28]])
    assert found == []
    block = result.extra["blocks"][0]
    assert block["columns"] == ["", "rank 0", "rank 1"] and block["rows"][1] == ["step 1", 22, 22]
    labelled = base_result(Case("flux", parse_layout("ulysses2"), "native", "fp32", flow="cache_fbc"))
    found = decisions.failures(labelled, [[28, 22], [28, 28]], ["step 0 cond", "step 0 uncond"])
    assert found[0].subject == "step 0 uncond" and labelled.extra["blocks"][0]["rows"][1][0] == "step 0 uncond"


def test_a_step_at_which_the_ranks_decided_differently_fails_naming_it():  # the comparison's negative control
    _, found = _judged([[28, 22, 22], [28, 22, 28]])
    assert [(item.check, item.subject) for item in found] == [("cache_decisions", "step 2")]
    assert "step 2: the ranks decided differently (nn.Linear calls per rank: 22, 28)" in found[0].text


def test_a_cache_that_reused_nothing_fails_and_a_rank_without_a_record_too():
    _, found = _judged([[28, 28, 28], [28, 28, 28]])
    assert [item.check for item in found] == ["cache_reuse"]
    _, found = _judged([[28, 22], None])
    assert [item.check for item in found] == ["cache_decisions"] and "rank 1: 0" in found[0].text
    assert _judged(None)[1] == []  # a case that ran once has no loop to judge


# --- one real run: 2 ranks ------------------------------------------------------------------------------------------

RUN = [("flux", "tp2", "cache_fbc", None), ("flux", "tp2", "cache_fbc", "cache_never_reuses"),
       ("flux", "ulysses2", "cache_taylorseer", None), ("flux", "ulysses2", "cache_mag_after", None),
       ("qwenimage", "tp2", "cache_taylorseer", None), ("qwenimage", "tp2", "cache_taylorseer", "cache_decides_alone"),
       ("flux", "ulysses2", "cache_taylorseer", "cache_decides_alone")]
# The pictures, through the pipelines' own loops (harness.flows.pipeline_loop): the same judge, the same controls
PICTURES = [("flux", "tp2", "cache_fbc", None), ("flux", "tp2", "cache_fbc", "cache_never_reuses"),
            ("qwenimage", "tp2", "cache_taylorseer", None),
            ("qwenimage", "tp2", "cache_taylorseer", "cache_decides_alone")]


@pytest.fixture(scope="module")
def cached(tmp_path_factory, zoo_references):
    """The cases above in one launch of 2 ranks, judged without known issues."""
    from harness.run import runner
    from harness.run.plan import PlannedCase
    from harness.run.settings import load_settings

    folder = tmp_path_factory.mktemp("caches")
    (folder / "pyproject.toml").write_text("[tool.harness]\n")
    empty = folder / "none.toml"
    empty.write_text("")
    settings = load_settings({"references": str(zoo_references), "report_dir": str(folder / "reports"),
                              "known_issues": str(empty)}, start=folder)
    plan = [PlannedCase(Case(model, parse_layout(layout), "native", "fp32", kind, flow=flow, fault=fault))
            for kind, cases in (("tensor", RUN), ("image", PICTURES)) for model, layout, flow, fault in cases]
    summary = runner.run(settings, plan, echo=lambda line: None, localize_failures=False, purpose="selftest")
    return {result.case_id: result for result in summary.results}


def _work(result):
    block = next(block for block in result.extra["blocks"] if block["title"].startswith("What each rank computed"))
    return [row[1:] for row in block["rows"]]


@pytest.mark.slow
def test_caches_decide_alike_on_every_rank_and_reuse_where_their_layouts_agree(cached):
    for case_id in ("flux/tp2/native/fp32/tensor/cache_fbc", "flux/ulysses2/native/fp32/tensor/cache_taylorseer",
                    "flux/ulysses2/native/fp32/tensor/cache_mag_after",
                    "qwenimage/tp2/native/fp32/tensor/cache_taylorseer"):
        result = cached[case_id]
        assert result.status is Status.PASS, (case_id, result.reason)
        work = _work(result)
        assert all(len(set(step)) == 1 for step in work) and min(min(step) for step in work) < work[0][0]


@pytest.mark.slow
def test_a_cache_that_never_reuses_fails_where_its_clean_twin_passes(cached):
    broken = cached["flux/tp2/native/fp32/tensor/cache_fbc+cache_never_reuses"]
    assert broken.status is Status.FAIL and "the cache reused nothing" in broken.reason
    assert all(step == [28, 28] for step in _work(broken))


@pytest.mark.slow
def test_ranks_that_decide_differently_fail_naming_the_step_or_end_as_a_timeout_never_a_hang(cached):
    # qwenimage tp2: the all-reduces still pair up (same sizes), so the run ends and the record shows the divergence
    alone = cached["qwenimage/tp2/native/fp32/tensor/cache_taylorseer+cache_decides_alone"]
    assert alone.status is Status.FAIL and "step 1 cond: the ranks decided differently" in alone.reason
    assert any(item["check"] == "cache_decisions" and item["subject"] == "step 1 cond" for item in alone.evidence)
    # flux ulysses2: one rank waits in an all-to-all the other never joins; the case, named with its flow, is TIMEOUT
    hung = cached["flux/ulysses2/native/fp32/tensor/cache_taylorseer+cache_decides_alone"]
    assert hung.status is Status.TIMEOUT and "stuck: rank 0" in hung.reason


@pytest.mark.slow
def test_a_picture_through_its_pipelines_loop_is_judged_by_the_same_record(cached):
    """The pipeline's own loop (its `cond` and `uncond` calls): a cache that reuses passes with every rank alike; one
    that never reuses, and ranks that decide apart, fail as the tensor kind's do."""
    for case_id in ("flux/tp2/native/fp32/image/cache_fbc", "qwenimage/tp2/native/fp32/image/cache_taylorseer"):
        result = cached[case_id]
        assert result.status is Status.PASS, (case_id, result.reason)
        work = _work(result)
        assert all(len(set(step)) == 1 for step in work) and min(min(step) for step in work) < work[0][0]
    broken = cached["flux/tp2/native/fp32/image/cache_fbc+cache_never_reuses"]
    assert broken.status is Status.FAIL and "the cache reused nothing" in broken.reason
    alone = cached["qwenimage/tp2/native/fp32/image/cache_taylorseer+cache_decides_alone"]
    assert alone.status is Status.FAIL and "the ranks decided differently" in alone.reason
    assert any(item["check"] == "cache_decisions" and item["subject"].endswith(" cond") for item in alone.evidence)
