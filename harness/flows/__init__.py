"""What users do around `enable_parallelism` (the `flow` axis): one module per family, each flow registered by
`@flow` on its own code (harness.flows.registry). Importing the package imports every family, so the registry is whole
wherever it is read; a flow of your own is a module named in the environment variable `HARNESS_FLOWS`
(comma-separated, importable from every rank) that registers it with `@flow` when imported: the plan, the ids, the
ranks, the selftest's generated control and the reports then take it with no other file touched.
"""

from harness.flows import adapters, attention, caches, compiling, ip_adapter, memory, parallel  # noqa: F401 - each family registers its flows
from harness.flows.calls import make, make_at
from harness.flows.registry import (
    AFTER,
    BEFORE,
    CHANGES,
    KEEPS,
    NONE,
    ONE_DEVICE_DTYPE,
    REGISTERED,
    VALUES,
    Call,
    Equivalent,
    Flow,
    FlowValue,
    Refused,
    Setting,
    compiled_by,
    compiling_mode,
    flow,
    inputs_of,
    quick_compiled,
    quick_values,
    refusal_of,
    sets_backend,
    value_of,
)

ENV = REGISTERED.env
REGISTERED.import_own()

__all__ = ["AFTER", "BEFORE", "CHANGES", "ENV", "KEEPS", "NONE", "ONE_DEVICE_DTYPE", "REGISTERED", "VALUES", "Call",
           "Equivalent", "Flow", "FlowValue", "Refused", "Setting", "compiled_by", "compiling_mode", "flow",
           "inputs_of", "make", "make_at", "quick_compiled", "quick_values", "refusal_of", "sets_backend", "value_of"]
