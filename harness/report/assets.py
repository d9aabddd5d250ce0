"""The page shell of index.html and compare.html, and the stylesheet and scripts it inlines.

The CSS and JavaScript are files of the package (harness/report/static/, package data in pyproject.toml), where
linters, formatters and browser devtools see them; a page inlines what it needs when it is written, so it stays one
self-contained file that works from disk or a CI artifact.
"""

from __future__ import annotations

from functools import cache
from html import escape
from importlib import resources

STATIC = "static"


@cache
def static(name: str) -> str:
    """The text of `static/<name>` as installed with the package."""
    return resources.files("harness.report").joinpath(STATIC, name).read_text(encoding="utf-8")


def page(title: str, body: str, scripts: tuple[str, ...] = ()) -> str:
    """The shell of a page: the stylesheet inline, then `scripts` (files under static/) in one element after the
    body, in their order (each one an IIFE; the later ones use what the earlier ones define)."""
    js = f"<script>{''.join(_inline(static(name)) for name in scripts)}</script>" if scripts else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{static('report.css')}</style></head>\n<body>{body}{js}</body></html>\n"
    )


def _inline(code: str) -> str:
    """A script as the body of a <script> element: no `</script` may appear in it (it would end the element)."""
    if "</script" in code.lower():
        raise ValueError("a static script must not contain '</script'")
    return code
