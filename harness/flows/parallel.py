"""Flows on parallelism itself: turned off and on again."""

from __future__ import annotations

from harness.flows.registry import AFTER, KEEPS, Call, Refused, flow


@flow(Call("remove_context_parallel(model, <its cp_plan>)", KEEPS),
      Call("model.enable_parallelism(config=<the same config>) again", KEEPS),
      layouts="cp", positions=(AFTER,),
      refused=(Refused(AFTER, "cp", "Parallelism is already applied to this", "diffusers.models.modeling_utils",
                       "enable_parallelism's check of an applied config"),))
def reenable(module, setting):
    """The config the model was parallelized with (the case's, or the one from_pretrained was given). One device has
    none to turn off and on: it makes neither call, and its output stays the plain one."""
    from diffusers.hooks.context_parallel import remove_context_parallel

    config = setting.config if setting.config is not None else getattr(module, "_parallel_config", None)
    if config is not None:
        remove_context_parallel(module, setting.cp_plan if setting.cp_plan is not None else module._cp_plan)
    yield
    if config is not None:
        module.enable_parallelism(config=config, cp_plan=setting.cp_plan)
    yield
