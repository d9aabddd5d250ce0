"""Regional compilation as a user's call: `compile_repeated_blocks(fullgraph=True)`, as diffusers' compile guide
writes it, before `enable_parallelism` (after it is the `regional` mode: the harness compiles the blocks once the
layout is applied, harness.core.modes, and `--fullgraph` makes a graph break FAIL there).

The call compiles through the backend the setting gives, Inductor either way; on a rank that backend also reads every
graph handed to it, so the case's proof is the compiled one (harness.rank.compiled) and not the eager recorder's,
which Dynamo would trace into the blocks. A rank that left the call out runs its blocks eager: its record of what the
call changed (each block compiled, harness.flows.state) shows it where the numbers cannot.
"""

from __future__ import annotations

from harness.flows.registry import BEFORE, KEEPS, Call, flow


@flow(Call("model.compile_repeated_blocks(fullgraph=True): each repeated block compiled by Inductor", KEEPS),
      needs_api=("compile_repeated_blocks",), positions=(BEFORE,), compiles="regional", kinds=("tensor", "image"),
      # compiling costs tens of seconds a case on a CPU: the full plan and `--flows` run it, the quick plan's
      # compiled flows (`quick_compiled`) stand for it there. Not trained yet: under fullgraph=True every context-
      # parallel `native` case and flux's tensor-parallel one crash, and the train kind's findings are not yet
      # excused by entries that name this flow (docs/flows.md, "Not yet")
      quick=())
def regional_compile(module, setting):
    module.compile_repeated_blocks(fullgraph=True, backend=setting.compile_backend)
