"""What diffusers warned of while a case ran on this rank, kept as the case's evidence: SeaCache's fail-open under
tensor parallelism warns once and then does nothing, and the case says that it warned, not that it was silent.

diffusers' logging is quieted to errors for the harness's own output (harness.core.determinism.quiet_diffusers);
while a case runs, its warnings are caught here instead of printed, its "experimental feature" notices left out
(they repeat on every case and say nothing of it)."""

from __future__ import annotations

import contextlib
import logging

NOISE = ("experimental",)  # texts of the notices left out
KEPT = 10  # the most distinct warnings a case keeps


class _Kept(logging.Handler):
    def __init__(self, found: list[str]):
        super().__init__(logging.WARNING)
        self.found = found

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().strip()
        if text not in self.found and len(self.found) < KEPT and not any(word in text for word in NOISE):
            self.found.append(text)


@contextlib.contextmanager
def caught():
    """The distinct warnings diffusers logged inside the block (a list, filled as they come), none printed."""
    found: list[str] = []
    logger = logging.getLogger("diffusers")
    printing = [(handler, handler.level) for handler in logger.handlers]
    level, kept = logger.level, _Kept(found)
    for handler, _ in printing:
        handler.setLevel(max(handler.level, logging.ERROR))
    logger.addHandler(kept)
    logger.setLevel(logging.WARNING)
    try:
        yield found
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
        for handler, was in printing:
            handler.setLevel(was)
