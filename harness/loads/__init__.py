"""How a case's model gets its weights and its parallelism: the `load` axis (harness.core.axes), each load declared
once, by a decorator on its own code (harness.loads.registry), as faults are (harness.faults).

One module per family: the ways diffusers documents (documented) and the tensor-parallel combinations it guards
against (tp_combinations). Importing the package imports every family, so the registry is whole wherever it is read;
a load of your own is a module named in the environment variable `HARNESS_LOADS` (comma-separated, importable from
every rank) that registers it with `@checkpoint_load` or `@memory_load` when imported: the plan, the ids, the ranks'
builds and the reports then take it with no other file touched.
"""

import importlib
import os

from harness.core.errors import HarnessError
from harness.loads import documented, tp_combinations  # noqa: F401 - each family registers its loads on import
from harness.loads.guard import Guard
from harness.loads.registry import ENABLE, LOADS, Load, checkpoint_load, enable_id, load_of, memory_load

ENV = "HARNESS_LOADS"

for _module in filter(None, (name.strip() for name in os.environ.get(ENV, "").split(","))):
    try:
        importlib.import_module(_module)
    except ImportError as error:
        raise HarnessError(f"{ENV}: cannot import load module {_module!r} ({error})") from None

__all__ = ["ENABLE", "ENV", "LOADS", "Guard", "Load", "checkpoint_load", "enable_id", "load_of", "memory_load"]
