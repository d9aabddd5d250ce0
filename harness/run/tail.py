"""Files that ranks are still writing, read as streams: a line is handed on only once its newline has arrived, and
each line once.

A rank writes its events line by line (harness.engine.worker), but a long line reaches the file in several writes,
and its stacks come in a burst from a signal handler. Whoever reads while they write (the launcher, a node's agent,
the hang diagnostics, `--resume` after a run killed mid-write) sees a torn last line; reading from a byte offset
and keeping the part after the last newline for the next look is what makes that harmless.
"""

from __future__ import annotations

from pathlib import Path


def complete_lines(data: bytes) -> tuple[list[str], int]:
    """The whole lines of `data` (decoded, newline dropped) and how many bytes they took: a torn tail is left for
    later."""
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), end


class LineTail:
    """New whole lines of one file since the last look; a file not there yet has none."""

    def __init__(self, path: Path, offset: int = 0):
        self.path, self.offset = Path(path), offset

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        lines, used = complete_lines(data)
        self.offset += used
        return lines

    @staticmethod
    def size(path: Path) -> int:
        """Bytes in `path` now (0 when it is not there): where a tail that wants only what comes next starts."""
        try:
            return Path(path).stat().st_size
        except OSError:
            return 0
