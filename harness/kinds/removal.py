"""The `removal` kind: diffusers' context parallelism enabled, the model run, the parallelism removed again with
diffusers' `remove_context_parallel`, the model run again. The second run must be the single-device run of the same
model, dtype and backend, bit for bit, and must communicate nothing: a model handed back to one device must not
keep a trace of the layout it ran under. As in a user's script, diffusers builds the device mesh itself (no `mesh=`),
and `native`, diffusers' default backend, is left unset.

Its cases read the tensor kind's references (the same forward); the run under the layout is the tensor kind's
concern and is not judged here (its proof, the backends and collectives of that run, is). The single-device
baseline is the same build run on rank 0 without any layout. Context-parallel layouts only (diffusers' own, not
PyTorch's); eager only.
"""

from __future__ import annotations

from harness.core.applicability import NotApplicable
from harness.core.evidence import Evidence
from harness.core.figures import FigureSpec
from harness.core.options import Option
from harness.kinds.base import Built, Check
from harness.kinds.on_forward import FORWARD, LAYOUT_ABS, OnForwardKind

REMOVED_ABS = FigureSpec("removed_max_abs", "after removal: max abs diff to one device (bit for bit: 0)",
                         cell="{value:.1e}")
REMOVED_COMMS = FigureSpec("removed_collectives", "after removal: collectives in the run", "d")


class RemovalKind(OnForwardKind):
    name = "removal"
    help = "context parallelism enabled, run, removed with remove_context_parallel, run: one device's output again"
    checks = {"removed_max_abs": Check(), "removed_collectives": Check()}
    figures = (REMOVED_ABS, REMOVED_COMMS, LAYOUT_ABS)
    layouts_option = Option("layouts", ["ulysses2", "ring2", "ulysses2any"], "Context-parallel layouts the removal "
                                                                              "kind runs (one of each sharder and "
                                                                              "attention).", is_list=True)
    kept = "removed"  # the output after the removal: judged bit for bit against one device (no noise draws)
    repeats = False  # its run takes the parallelism it ran under off the model
    cost_s = 0.5

    def unavailable(self) -> str | None:
        import importlib

        hooks = importlib.import_module("diffusers.hooks.context_parallel")
        return None if hasattr(hooks, "remove_context_parallel") else NotApplicable(
            "this diffusers has no remove_context_parallel")

    def applies(self, layout) -> bool:
        return layout.is_context_parallel and not layout.is_data_parallel and not layout.is_torch_context_parallel

    def build(self, case, reference, device, load) -> Built:
        built = FORWARD.build(case, reference, device, load)
        model, once = built.module, built.run
        if case.backend == "native":  # diffusers' default, left unset as a user's script leaves it
            model.reset_attention_backend()

        def run(recording=None):
            """Under the layout (recorded as the proof), then, where a layout was applied, removed and run again."""
            import contextlib

            from harness.rank.recorder import RunRecorder

            with recording or contextlib.nullcontext():
                first = once()
            if model._parallel_config is None:  # the single-device baseline: no layout to remove
                return {"layout": first, "removed": first, "collectives": 0}
            self.remove(model, built.cp_plan or model._cp_plan)
            with RunRecorder(model) as after:
                removed = once()
            count = sum(row[0] for per_module in after.recorded().values() for row in per_module.values())
            return {"layout": first, "removed": removed, "collectives": count}

        return Built(model, run, cp_plan=built.cp_plan, recorded=run, own_mesh=True)

    def remove(self, model, plan: dict) -> None:
        """What hands the model back to one device: diffusers' own `remove_context_parallel`."""
        from diffusers.hooks.context_parallel import remove_context_parallel

        remove_context_parallel(model, plan)

    def measure(self, output, reference, baseline, case, images_dir, draws=None) -> dict:
        metrics = {"layout_max_abs": self.layout_max_abs(output, reference), "collectives": output["collectives"]}
        if isinstance(baseline, str):
            metrics["baseline_error"] = baseline
        else:
            metrics["removed_max_abs"] = float((output["removed"].float().cpu() - baseline).abs().max())
        return metrics

    def judge(self, result, metrics: dict, policy) -> list[Evidence]:
        removed, collectives = metrics.get("removed_max_abs"), metrics["collectives"]
        result.figures = [REMOVED_ABS.of(removed, 0.0), REMOVED_COMMS.of(collectives, 0),
                          LAYOUT_ABS.of(metrics["layout_max_abs"])]
        found = []
        if removed is None:
            found.append(Evidence("cannot_judge", f"cannot judge: the single-device run failed "
                                                  f"({metrics.get('baseline_error')})"))
        elif not removed == 0.0:
            found.append(Evidence("removed_max_abs", f"after remove_context_parallel the output is {removed:.3g} "
                                                     "(max abs) from the single-device run's, not bit for bit",
                                  value=removed, limit=0.0))
        if collectives:
            found.append(Evidence("removed_collectives", f"after remove_context_parallel the run still performed "
                                                         f"{collectives} collective(s)", value=collectives, limit=0))
        return found
