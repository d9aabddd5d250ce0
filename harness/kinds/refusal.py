"""The `refusal` kind: what diffusers must refuse, tried the way a user would get it wrong (harness.catalogue.refusals:
invalid parallel configs, malformed `_cp_plan`s and `_tp_plan`s, `enable_parallelism` twice). Each invalid input is
tried on a fresh model of the case, and must be refused with diffusers' own message: accepted is a FAIL naming it (a
plan that silently leaves an input whole), refused with another error a FAIL too (a refusal that is not the one
meant).

The case first runs its layout's valid config once, recorded as the proof (so the ranks, the backend and the
collectives of the layout are shown to work where the invalid inputs are tried); its output is the tensor kind's
forward and is not judged here. Refusals depend neither on the dtype nor on the attention backend: fp32 and
diffusers' default backend only. Eager only; its cases read the tensor kind's references.
"""

from __future__ import annotations

from harness.core.applicability import NotApplicable
from harness.core.evidence import Evidence
from harness.core.figures import FigureSpec, table
from harness.core.options import Option
from harness.kinds.base import Built, Check
from harness.kinds.on_forward import FORWARD, LAYOUT_ABS, OnForwardKind

REFUSED = FigureSpec("inputs_refused", "invalid inputs refused with diffusers' message", "d", cell="{value} refused")
TRIED = FigureSpec("inputs_tried", "invalid inputs tried", "d")


class RefusalKind(OnForwardKind):
    name = "refusal"
    help = "invalid configs and cp_plans given to enable_parallelism: each must be refused with diffusers' message"
    checks = {"accepted": Check("invalid inputs", figure=False), "refused_otherwise": Check("invalid inputs",
                                                                                          figure=False)}
    figures = (REFUSED, TRIED, LAYOUT_ABS)
    layouts_option = Option("layouts", ["ulysses2", "tp2"], "Layouts the refusal kind tries its invalid inputs on "
                                                             "(the context-parallel ones on a CP layout, the tensor-"
                                                             "parallel ones on a TP one).", is_list=True)
    localizes = False  # an accepted input is no module's output to trace
    repeats = False  # it runs no model
    cost_s = 2.0  # a fresh model for each of its invalid inputs (15 on a CP layout, 5 on a TP one)

    def unavailable(self) -> str | None:
        import diffusers

        return None if hasattr(diffusers, "ContextParallelConfig") else NotApplicable(
            "this diffusers has no ContextParallelConfig")

    def applies(self, layout) -> bool:
        from harness.catalogue import refusals

        return not layout.is_data_parallel and not layout.is_torch_context_parallel and bool(
            refusals.for_layout(layout))

    def crosses(self, case) -> bool:
        """A refusal does not depend on the dtype or the attention backend: fp32 on diffusers' default."""
        return case.dtype == "fp32" and case.backend == "native"

    def build(self, case, reference, device, load) -> Built:
        built = FORWARD.build(case, reference, device, load)
        model, once, found = built.module, built.run, {}

        def parallelize(mesh):
            found["mesh"] = mesh

        def run(recording=None):
            """The valid layout once (recorded as the proof), then, where a layout was applied, every invalid input
            on a fresh model."""
            import contextlib

            with recording or contextlib.nullcontext():
                output = once()
            if model._parallel_config is None:  # the single-device baseline: nothing to refuse
                return {"layout": output, "outcomes": []}
            return {"layout": output, "outcomes": self.try_all(case, reference, device, found.get("mesh"),
                                                               built.cp_plan, model)}

        return Built(model, run, cp_plan=built.cp_plan, recorded=run, parallelize=parallelize)

    def try_all(self, case, reference, device, mesh, cp_plan, model) -> list[dict]:
        """Each invalid input of the layout tried: refused (with its message or another), accepted, or not tried
        and why."""
        from harness.catalogue import refusals
        from harness.rank import loading
        from harness.rank.backends import first_line

        attempt = refusals.Attempt(lambda: FORWARD.build(case, reference, device, loading.enabled()), case.layout,
                                   mesh, cp_plan)
        plan = attempt.plan(model)
        outcomes = []
        for invalid in refusals.for_layout(case.layout):
            outcome = {"name": invalid.name, "what": invalid.what, "message": invalid.message}
            why = refusals.not_tried(invalid, plan)
            if why is not None:
                outcomes.append({**outcome, "not_tried": why})
                continue
            try:
                invalid.attempt(attempt)
            except Exception as error:  # noqa: BLE001 - the refusal is what is tried for
                outcome["observed"] = first_line(error)
            outcomes.append(outcome)
        return outcomes

    def measure(self, output, reference, baseline, case, images_dir, draws=None) -> dict:
        return {"layout_max_abs": self.layout_max_abs(output, reference), "outcomes": output["outcomes"]}

    def judge(self, result, metrics: dict, policy) -> list[Evidence]:
        tried = [outcome for outcome in metrics["outcomes"] if "not_tried" not in outcome]
        found = []
        for outcome in tried:
            observed = outcome.get("observed")
            if observed is None:
                found.append(Evidence("accepted", f"diffusers accepted {outcome['what']} ({outcome['name']}); "
                                                  f"expected its refusal '{outcome['message']}'", outcome["name"]))
            elif outcome["message"] not in observed:
                found.append(Evidence("refused_otherwise", f"{outcome['name']}: refused, but not with diffusers' "
                                                           f"message '{outcome['message']}': {observed}",
                                      outcome["name"]))
        refused = len(tried) - len(found)
        result.figures = [REFUSED.of(refused), TRIED.of(len(tried)),
                          LAYOUT_ABS.of(metrics["layout_max_abs"])]
        result.extra["blocks"] = [table("Invalid inputs", ["input", "what", "diffusers said"],
                                        [[outcome["name"], outcome["what"], _said(outcome)]
                                         for outcome in metrics["outcomes"]], code_columns=(0,))]
        if not tried:
            found.append(Evidence("cannot_judge", "cannot judge: no invalid input could be tried on this release and "
                                                  "model (" + "; ".join(f"{o['name']}: {o['not_tried']}"
                                                                        for o in metrics["outcomes"]) + ")"))
        return found


def _said(outcome: dict) -> str:
    """What diffusers answered an invalid input: its error, "accepted", or why it was not tried."""
    if "not_tried" in outcome:
        return f"not tried: {outcome['not_tried']}"
    return outcome.get("observed") or "accepted"
