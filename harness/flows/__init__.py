"""What users do around `enable_parallelism` (the `flow` axis): one module per family, each flow registered by
`@flow` on its own code (harness.flows.registry). Importing the package imports every family, so the registry is whole
wherever it is read.
"""

from harness.flows import adapters, attention, caches, memory, parallel  # noqa: F401 - each family registers its flows
from harness.flows.registry import (
    AFTER,
    BEFORE,
    NONE,
    REGISTERED,
    VALUES,
    Flow,
    FlowValue,
    Refused,
    Setting,
    flow,
    quick_values,
    refusal_of,
    value_of,
)

__all__ = ["AFTER", "BEFORE", "NONE", "REGISTERED", "VALUES", "Flow", "FlowValue", "Refused", "Setting", "flow",
           "quick_values", "refusal_of", "value_of"]
