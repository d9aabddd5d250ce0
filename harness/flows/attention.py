"""Flows on attention: processors set by hand, the backend set after parallelism (as diffusers' distributed-inference
guide orders it), and fused QKV projections."""

from __future__ import annotations

from harness.flows.registry import AFTER, BEFORE, KEEPS, Call, flow


# After context parallelism the processors set have no parallel config: the communication proof fails, which its
# known_issues.toml entry names exactly (0 exchanges at every attention module), so the quick plan runs both
# positions and shows the finding as XFAIL (docs/flows.md)
@flow(Call("model.set_attn_processor({name: <a new processor of the same class>}): custom or reset processors",
           KEEPS), needs_api=("set_attn_processor",), quick=(BEFORE, AFTER))
def processor(module, setting):
    """A fresh processor of each module's own class, as a user installs a custom one or resets them: diffusers keeps
    the parallel config and the backend on the processor objects, so what is set after parallelism has neither."""
    module.set_attn_processor({name: type(found)() for name, found in module.attn_processors.items()})


@flow(Call("model.set_attention_backend(<the case's backend>) after enable_parallelism, the order of diffusers' "
           "distributed-inference guide (the model loaded with its default backend)", KEEPS),
      positions=(AFTER,), needs_api=("set_attention_backend",), sets_backend=True)
def backend(module, setting):
    module.set_attention_backend(setting.backend)


@flow(Call("model.fuse_qkv_projections(): the query, key and value projections fused into one", KEEPS),
      needs_api=("fuse_qkv_projections",))
def fused_qkv(module, setting):
    module.fuse_qkv_projections()
