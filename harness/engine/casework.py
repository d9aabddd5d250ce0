"""One case on a rank: build it through its kind, apply the layout, run it once with the proof of what ran recorded
in that very run (harness.rank.recorder), and measure it against the reference and its single-device baselines."""

from __future__ import annotations

import time
from dataclasses import replace

from harness import faults, flows
from harness.core.modes import mode_of
from harness.core.records import Case
from harness.engine import drift, repeat
from harness.engine.baselines import Baselines, flow_one_device
from harness.engine.context import RankContext
from harness.kinds import kind_of
from harness.loads import ENABLE, load_of
from harness.rank import backends, comms_check, loading, torch_cp, warned
from harness.rank.compiled import CompiledRun
from harness.rank.recorder import RunRecorder


def run_case(context: RankContext, case: Case) -> tuple[object, dict]:
    """The case's output on this rank, and what ran: timings, dispatched backends, executed kernels, collectives."""
    started = time.perf_counter()
    context.phases.clear()
    reference = context.reference(case)
    checkpoint = load_of(case.load).checkpoint
    with faults.active(case.fault if checkpoint else None):  # from_pretrained applies the layout: a loader's bug acts
        built = context.build(case, reference)
    loaded = _check_load(context, case, reference, built) if checkpoint else None
    with faults.active(case.fault), warned.caught() as warnings:
        compiled = _compiler(case)
        with context.phase("parallel setup"):
            flow_changes = context.apply_layout(case, built, compiled)
        _compile(context, case, built, compiled)
        backends.reset_dispatches()
        recorder = compiled or RunRecorder(built.module, built.kernel_scope)
        context.sync(reset_peak=True)
        forward_started = time.perf_counter()
        with context.torch_context_parallel(case, built):
            output = built.run_recorded(recorder)  # the proof is recorded in this very run (a few ms a case)
        context.sync()
        forward_s, seconds = time.perf_counter() - forward_started, time.perf_counter() - started
        context.phases["forward"] += forward_s
        dispatched, functions = backends.dispatches(), backends.functions_run()  # compiled too (harness::dispatched)
        proof = _prove_comms(case, built, recorder) if case.layout.world_size > 1 else {}
        with context.phase("repeat"):
            repeated = repeat.check(context, case, built, output)  # run twice in one launch: bit for bit alike?
    if case.layout.is_torch_context_parallel and built.torch_cp_output_dim is not None:
        output = torch_cp.unshard(case.layout, context.mesh(case.layout), output, built.torch_cp_output_dim)
    placements = None
    if hasattr(output, "full_tensor"):  # materialised to compare, and reported: diffusers returns plain tensors
        placements = str(tuple(output.placements))
        output = output.full_tensor()
    return output, {"forward_s": forward_s, "seconds": seconds, "dispatched": dispatched,
                    "kernels": recorder.executed(), "output_placements": placements, "functions": functions,
                    "expected_function": backends.expected_function(case.backend),
                    "compiled": compiled.figures() if compiled else None, "load": loaded,
                    "steps": built.denoising.work if built.denoising else None,
                    "step_labels": built.denoising.labels if built.denoising else None, "flow_changes": flow_changes,
                    "warnings": warnings, "repeat": repeated, **proof}


def _check_load(context: RankContext, case: Case, reference, built) -> dict:
    """What the checkpoint load gave this rank, parameter by parameter, against what `enable_parallelism` gives on
    the same layout and mesh (its twin, built without the case's fault): a loader that read the wrong slice, the
    wrong file or another rank's shard differs here, whatever the numbers say. Taken before the kind's own engine
    (FSDP) reshards anything."""
    mesh = context.mesh(case.layout)
    with context.phase("load check"):
        twin = context.build(replace(case, load=ENABLE, fault=None), reference)
        config = case.layout.diffusers_config(mesh)
        if config is not None:
            twin.module.enable_parallelism(config=config, cp_plan=twin.cp_plan)
        found = loading.differing(loading.shard_digests(built.module), loading.shard_digests(twin.module))
        params = sum(1 for _ in built.module.parameters())
    plan = loading.plan_for(case, context.checkpoints, mesh)
    # diffusers records the config on the model it parallelized: none on the model the case runs means another model
    # took the place of the one from_pretrained loaded with it
    unconfigured = plan.config is not None and getattr(built.module, "_parallel_config", None) is None
    return {**loading.describe(plan, type(built.module).__name__, case.layout), "params": params, "differing": found,
            "unconfigured": unconfigured}


def _compiler(case: Case) -> CompiledRun | None:
    """What compiles the case and reads its graphs: its compiled mode's, or that of a flow that compiles the model
    by its own call (harness.flows.compiling); None for an eager case."""
    mode = mode_of(flows.compiling_mode(case))
    return None if mode.backend is None else CompiledRun(mode)


def _compile(context: RankContext, case: Case, built, compiled: CompiledRun | None) -> None:
    """A compiled case: the kind's module compiled in place after the layout (or by the flow's call already), and
    run once, the compile (its own phase), then once eager for its module calls; the measured run that follows
    reuses the graphs, and what it compiles anew counts as recompiles."""
    if compiled is None:
        return
    with context.phase("compile"), context.torch_context_parallel(case, built):
        if flows.compiled_by(case.flow):
            compiled.prepare(built.module)
        else:
            compiled.compile(built.module)
        built.run()
        compiled.count_calls(built)
        context.sync()


def _prove_comms(case: Case, built, recorder: RunRecorder | CompiledRun) -> dict:
    """The collectives the run performed, and what the layout predicts it must have (harness.rank.comms_check)."""
    expected = comms_check.predict(built.module, case.layout, built.cp_plan, recorder, backward=built.loss is not None)
    if isinstance(recorder, CompiledRun):
        expected = recorder.in_graphs(expected)
    return {"comms": recorder.recorded(), "comms_expected": [item.to_dict() for item in expected]}


def flow_reference(context: RankContext, baselines: Baselines, case: Case) -> tuple[object, dict | None]:
    """The case's reference, and what its flow did: the captured file (None), or for a flow (harness.flows) the fp32
    output of one device that made the same calls on the file's weights and inputs, with how far those calls moved
    it from the file (`effect`), how far each call moved it from the call before (`calls`), and how far it ended from
    the model the calls must equal (`equals`); or why that one-device run failed (`error`: the file stays, and the
    case cannot be judged)."""
    reference = context.reference(case)
    value = flows.value_of(case.flow)
    if value.flow is None:
        return reference, None
    facts = {"position": value.position, "changes_numbers": value.flow.changes_numbers,
             "calls": [{"text": call.text, "declared": call.effect, "moved": None} for call in value.flow.calls]}
    one = flow_one_device(case)
    output = baselines.of(one)
    if isinstance(output, str):
        return reference, {**facts, "error": output}
    kind, record = kind_of(case.kind), baselines.record_of(one)
    flowed, effect = kind.flow_reference(reference, output)
    outputs = [reference.output, *record.between, output]
    if len(outputs) == len(facts["calls"]) + 1:  # one device's output before and after each call
        for call, before, after in zip(facts["calls"], outputs, outputs[1:], strict=False):
            call["moved"] = kind.flow_reference(replace(reference, output=before), after)[1]
    equals = value.flow.equals
    if equals is not None and record.equals is not None:
        facts["equals"] = {"text": equals.text}
        if isinstance(record.equals, str):
            facts["equals"]["error"] = record.equals
        else:
            facts["equals"]["diff"] = kind.flow_reference(replace(reference, output=record.equals), output)[1]
    return flowed, {**facts, "effect": effect}
def measure(context: RankContext, baselines: Baselines, case: Case, output) -> dict:
    """The kind's metrics against the reference and the single-device baseline of the case's dtype (and the other
    draws of its noise where the kind judges by them)."""
    kind = kind_of(case.kind)
    baselines.offer(case, output)
    (reference, flow), baseline = flow_reference(context, baselines, case), baselines.of(case)
    draws = {name: baselines.of(case, draw=name) for name in kind.draws_for(case)}
    with context.phase("metrics and images"):
        metrics = kind.measure(output, reference, baseline, case, context.images_dir, draws)
    metrics["drift"] = drift.of(context, baselines.shared, case) if kind.localizes else None  # one device vs its file
    if flow is None:
        return metrics
    record = baselines.record_of(case)  # what the same calls changed of the model on one device, in the case's dtype
    return {**metrics, "flow": {**flow, "one_device_changes": record.changes if record is not None else None}}
