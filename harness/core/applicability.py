"""Two things a case decided before launch can say: N/A, the combination cannot exist (diffusers refuses it, the
model has no plan for the layout, this diffusers release does not have the feature), or SKIP, it could have run
somewhere and did not here (CUDA only, a package missing, too many ranks).

The plan's reasons are text; the code that writes a reason declares its class once, by wrapping an N/A reason in
`NotApplicable` (a reason left plain is a SKIP). The text stays the same string, so every view and test that reads
a reason reads it as before; the verdict turns the class into a status (`status_of`).
"""

from __future__ import annotations

from harness.core.results import Status


class NotApplicable(str):
    """A plan-time reason saying that the combination cannot exist: nothing to install, no machine to run it on."""

    __slots__ = ()


def status_of(reason: str) -> Status:
    """The status of a case decided before launch with `reason`: N/A for a `NotApplicable` one, else SKIP."""
    return Status.NOT_APPLICABLE if isinstance(reason, NotApplicable) else Status.SKIP
