"""Where one device moved off its stored reference (harness.engine.drift), at the head of the page: a change of the
model, the backend, the compiler or torch, which every layout moves with, so it fails no case, and is said here
once per reference with the module it first left, each linked to a case that opens its module tree."""

from __future__ import annotations

from html import escape

from harness.core.figures import REFERENCE, is_number, with_role
from harness.core.results import CaseResult


def moved_banner(cases: list[CaseResult]) -> str:
    """A banner listing each reference whose one-device run left it ("" when none did)."""
    found: dict[tuple, CaseResult] = {}
    for case in cases:
        figure = with_role(case.figures, REFERENCE)
        if figure is None or not is_number(figure.get("limit")) or not figure["value"] > figure["limit"]:
            continue
        found.setdefault((case.model, case.shape, _line(case)), case)
    if not found:
        return ""
    items = "".join(f'<li><a href="#case-{escape(case.case_id)}"><code>{escape(model)}@{escape(shape)}</code></a> '
                    f"({escape(case.kind)}): first moved <code>{escape(line)}</code></li>"
                    for (model, shape, line), case in found.items())
    return ('<div class="banner" role="alert" id="moved">\u26a0 One device moved off its stored reference, beyond '
            "the reference's own noise: a change of the model, the backend, the compiler or torch (every layout moves "
            f"with it, so no case fails by it):<ul>{items}</ul></div>")


def _line(case: CaseResult) -> str:
    return str((case.extra.get("drift") or {}).get("line") or "")
