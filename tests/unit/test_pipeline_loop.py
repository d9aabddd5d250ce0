"""The image kind's loop for a cache flow (harness.flows.pipeline_loop): the tiny pipeline's own `__call__`, recorded
per transformer call with the cache context the pipeline opened, unchanged by the recording; the branch models that
stand for a cache's state per context; a cache through it reusing."""

import copy

import pytest
import torch

from harness import flows
from harness.catalogue.pipelines import build_pipeline, run_pipeline
from harness.catalogue.zoo import get_spec
from harness.core.errors import HarnessError
from harness.flows import pipeline_loop
from harness.flows.denoising import GUIDANCE
from harness.kinds.image import run_pipe

pytest.importorskip("transformers")
STEPS = 3


@pytest.fixture(scope="module")
def pipe():
    return build_pipeline("flux")


def _loop(pipe):
    return pipeline_loop.PipelineLoop(pipe, STEPS, get_spec("flux").cache_contexts)


def test_each_transformer_call_is_recorded_with_the_context_the_pipeline_opened(pipe):
    loop = _loop(pipe)
    run_pipe(pipe, "flux", loop)
    assert loop.guided and loop.labels == [f"step {step} {context}" for step in range(STEPS)
                                           for context in ("cond", "uncond")]
    assert len(set(loop.work)) == 1 and loop.work[0] > 0  # no cache: every call computes alike


def test_the_recording_changes_nothing_the_pipeline_computes_and_leaves_nothing_behind(pipe):
    recorded = run_pipe(pipe, "flux", _loop(pipe))
    plain = run_pipeline(pipe, "flux", steps=STEPS, guidance=GUIDANCE)
    assert (recorded == plain).all()
    assert "cache_context" not in vars(pipe.transformer) and "forward" not in vars(pipe.transformer)
    # guidance is no decoration: the same call without the negative branch gives another picture
    assert abs(run_pipeline(pipe, "flux", steps=STEPS) - plain).max() > 0.01


def test_a_guidance_distilled_pipeline_refuses_a_guided_call():
    with pytest.raises(HarnessError, match="guidance-distilled"):
        run_pipeline(build_pipeline("flux2"), "flux2", steps=1, guidance=GUIDANCE)
    assert pipeline_loop.of_flow("lora", get_spec("flux2"), None) is None
    assert pipeline_loop.of_flow("cache_mag", get_spec("flux2"), None).contexts == ("cond",)


def test_branch_models_run_the_call_of_their_own_context(pipe):
    """One device's equivalent of a cache's state per context: each call runs the model of the context the pipeline
    opened; copies of the transformer give its picture, and a branch model with other weights another one."""
    loop, calls = _loop(pipe), {"cond": 0, "uncond": 0}
    loop.branch_models = {name: copy.deepcopy(pipe.transformer) for name in calls}
    for name, model in loop.branch_models.items():
        model.register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    plain = run_pipeline(pipe, "flux", steps=STEPS, guidance=GUIDANCE)
    assert (run_pipe(pipe, "flux", loop) == plain).all() and calls == {"cond": STEPS, "uncond": STEPS}
    assert loop.work[0] > 0  # the branch models' work is counted
    with torch.no_grad():
        loop.branch_models["uncond"].proj_out.weight.mul_(0.5)
    assert abs(run_pipe(pipe, "flux", loop) - plain).max() > 0.01


def test_a_cache_through_the_pipelines_loop_reuses_at_a_step_and_reads_its_timestep():
    pipe = build_pipeline("flux")
    loop, seen = _loop(pipe), []
    setting = flows.Setting(torch.device("cpu"), "native", torch.float32, pipeline=pipe, denoising=loop)
    flows.REGISTERED["cache_taylorseer"].code(pipe.transformer, setting)
    pipe.transformer.register_forward_pre_hook(lambda *_: seen.append(float(loop.current_timestep())))
    run_pipe(pipe, "flux", loop)
    assert min(loop.work) < max(loop.work)
    assert seen[0] == seen[1] > seen[2] == seen[3]  # the scheduler's timestep, the same for both branches of a step
