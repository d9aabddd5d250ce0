"""How a case's model gets its weights and its parallelism: the `load` axis (harness.core.axes), each load declared
once, by a decorator on its own code (harness.loads.registry), as faults are (harness.faults).

One module per family: the ways diffusers documents (documented) and the tensor-parallel combinations it guards
against (tp_combinations). Importing the package imports every family, so the registry is whole wherever it is read;
a load of your own is a module named in the environment variable `HARNESS_LOADS` (comma-separated, importable from
every rank) that registers it with `@checkpoint_load` or `@memory_load` when imported: the plan, the ids, the ranks'
builds and the reports then take it with no other file touched.
"""

from harness.loads import documented, tp_combinations  # noqa: F401 - each family registers its loads on import
from harness.loads.guard import Guard
from harness.loads.registry import ENABLE, LOADS, Load, checkpoint_load, enable_id, load_of, memory_load

ENV = LOADS.env
LOADS.import_own()

__all__ = ["ENABLE", "ENV", "LOADS", "Guard", "Load", "checkpoint_load", "enable_id", "load_of", "memory_load"]
