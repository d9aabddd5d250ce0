"""Deliberate bugs for negative controls: each must make the harness report FAIL (docs/selftest.md).

One module per family, each fault registered by `@fault` on its own code (harness.faults.registry). Importing the
package imports every family, so the registry is whole wherever it is read; a fault of your own is a module named in
`HARNESS_FAULTS` that registers it with `@fault` when imported (harness.core.registry).
"""

from harness.faults import (  # noqa: F401 - each family registers its faults on import
    backends,
    caches,
    compiled,
    cp,
    flows,
    loading,
    model,
    reliability,
    targeted,
    torch_cp,
    tp,
    training,
)
from harness.faults.registry import REGISTERED, Fault, active, check, fault, find, is_model_change, usages

REGISTERED.import_own()

__all__ = ["REGISTERED", "Fault", "active", "check", "fault", "find", "is_model_change", "usages"]
