"""Flows on parallelism itself: turned off and on again."""

from __future__ import annotations

from harness.flows.registry import AFTER, Refused, flow


@flow("remove_context_parallel(model, <its cp_plan>), then model.enable_parallelism(config=<the same config>) again",
      layouts="cp", positions=(AFTER,),
      refused=(Refused(AFTER, "cp", "Parallelism is already applied to this", "diffusers.models.modeling_utils",
                       "enable_parallelism's check of an applied config"),))
def reenable(module, setting):
    from diffusers.hooks.context_parallel import remove_context_parallel

    plan = setting.cp_plan if setting.cp_plan is not None else module._cp_plan
    remove_context_parallel(module, plan)
    module.enable_parallelism(config=setting.config, cp_plan=setting.cp_plan)
