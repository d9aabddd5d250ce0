"""The one domain exception: a user error that ends with a clear message and an exit code, not a traceback."""


class HarnessError(Exception):
    """Bad input or state the user can fix; the message says what to do."""

    exit_code = 2


def traceback_text(limit: int = 4000) -> str:
    """The exception being handled, cut at whole frames: the header, then as many of the innermost frames (and the
    message) as fit in `limit` characters, so a report never starts in the middle of a frame."""
    import traceback

    lines = traceback.format_exc().splitlines(keepends=True)
    frame_starts = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if not frame_starts or len("".join(lines)) <= limit:
        return "".join(lines)
    head, tail = lines[: frame_starts[0]], lines[frame_starts[-1]:]
    kept = frame_starts[-1]
    for start in reversed(frame_starts[:-1]):
        if len("".join(head + lines[start:])) > limit:
            break
        kept = start
    omitted = sum(1 for start in frame_starts if start < kept)
    note = [f"  ... {omitted} outer frame(s) omitted ...\n"] if omitted else []
    return "".join(head + note + (lines[kept:] if kept < frame_starts[-1] else tail))
