"""What the server side of a case's detail decides: its badge, which image paths the page may load, and which links
to a traced cause it may show.

The detail itself (figures against their limits, failed checks, detail blocks by type, pictures, where it breaks,
communication, how it ran, the whole traceback) is drawn by the page script (static/detail.js) when the case is
opened, from the embedded records: a full plan's page would otherwise carry thousands of details nobody opens.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any
from urllib.parse import quote, urlsplit

ISSUE_ANCHOR = "issue-"  # the page's listing of known-issue entries: `#issue-12` for known_issues.toml #12
# An http(s) address in escaped text: up to white space or an escaped quote or bracket, less trailing punctuation
URL = re.compile(r"https?://(?:(?!&lt;|&gt;|&quot;|&#x27;)[^\s<>\"'])+?(?=[.,;:!?)\]]*(?:\s|&lt;|&gt;|&quot;|&#x27;|$))")


def badge(status: str) -> str:
    return f'<span class="badge s-{escape(status)}">{escape(status)}</span>'


def safe_relative(path: Any) -> str | None:
    """Images are files beside the report; anything with a scheme, a host or an absolute path is refused."""
    if not isinstance(path, str) or not path or path.startswith(("/", "\\")):
        return None
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or ":" in path.split("/")[0]:
        return None
    return quote(path.replace("\\", "/"), safe="/._-~")


def outside_link(url: Any) -> str | None:
    """A link out of the page (a known issue's traced cause) is followed, never loaded: only http(s) URLs are kept
    (a `javascript:` or relative one would run or resolve against the report folder)."""
    if not isinstance(url, str):
        return None
    parts = urlsplit(url.strip())
    return url.strip() if parts.scheme in ("http", "https") and parts.netloc else None


def linked(text: str) -> str:
    """`text` escaped, each http(s) address in it a link out of the page (a reason that names its upstream thread)."""
    return URL.sub(lambda found: (f'<a class="out-link" href="{found.group(0)}" target="_blank" '
                                  'rel="noopener noreferrer">'
                                  f"{found.group(0)}</a>"), escape(text))


def issue_anchor(key: str) -> str:
    """Where the page lists a known-issue entry: `issue-` and its number in known_issues.toml ("" without one)."""
    number = key.rpartition("#")[2].strip()
    return ISSUE_ANCHOR + number if number.isdigit() else ""


def cause_link(url: Any, text: str = "traced cause") -> str:
    """An anchor to a known issue's traced cause, opened in a new tab; "" when there is no followable link."""
    found = outside_link(url)
    if found is None:
        return ""
    return (f'<a class="cause-link" href="{escape(found)}" target="_blank" rel="noopener noreferrer">'
            f"{escape(text)} \u2197</a>")
