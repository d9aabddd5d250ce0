"""The one domain exception (a user error that ends with a clear message and an exit code, not a traceback), and how
an error is told in a report: its first line, or its traceback cut at whole frames."""


class HarnessError(Exception):
    """Bad input or state the user can fix; the message says what to do."""

    exit_code = 2


def first_line(error: BaseException) -> str:
    """The error's type and first line; for one of torch.compile's, also the line it explains it by (Dynamo's
    "RuntimeError when making fake tensor call" says what the call raised only there)."""
    text = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {text[0] if text else ''}".strip()
    explained = next((item.strip()[len("Explanation:"):].strip() for item in text[1:]
                      if item.strip().startswith("Explanation:")), "")
    return f"{line} ({explained})" if explained else line


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


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: from /proc, so interpreter start-up and imports count), else None."""
    import os

    try:
        with open("/proc/self/stat") as stat:
            started = int(stat.read().rpartition(")")[2].split()[19])  # field 22: start time in clock ticks
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(since_boot - started / os.sysconf("SC_CLK_TCK"), 0.0)
