"""One case's detail section: metrics against tolerance, dispatch, timing, errors, images and an error histogram."""

from __future__ import annotations

import json
import math
from html import escape
from typing import Any
from urllib.parse import quote, urlsplit

from harness.report.data import full, number, plain

IMAGE_ORDER = ("reference", "candidate", "diff", "ssim_map")
DASH = "\u2014"
_METRIC_ROWS = (("tolerance", "tolerance"), ("mean abs err", "mean_abs_err"), ("max rel err", "max_rel_err"),
                ("non-finite values", "nonfinite"), ("baseline err", "baseline_err"))
_SHOWN_EXTRA = {"images", "abs_err_hist", "traceback", "ssim", "psnr", "peak_mem_mb_per_rank"}


def data_attrs(case: dict[str, Any]) -> str:
    """The attributes the filter script matches on; the same on matrix links, table rows and detail sections."""
    keys = ("status", "model", "layout", "backend", "dtype")
    return " ".join(f'data-{key}="{escape(case[key])}"' for key in keys)


def badge(status: str) -> str:
    return f'<span class="badge s-{escape(status)}">{escape(status)}</span>'


def section(case: dict[str, Any], slug: str) -> str:
    """A closed <details> per case; the page script opens it when its matrix cell or table link is used."""
    parts = [_metrics(case), _reason(case), _images(case), _histogram(case), _other_extra(case)]
    return (
        f'<details class="case filterable" id="{escape(slug)}" {data_attrs(case)}>'
        f"<summary>{badge(case['status'])} <code>{escape(case['case_id'])}</code></summary>"
        f'<div class="case-body">{"".join(parts)}</div></details>'
    )


def _verdict(value: Any, limit: Any) -> str:
    """"x / tol = r" so a reader sees how close to the line a case is, not just which side."""
    x, tol = number(value), number(limit)
    if x is None or tol is None or tol <= 0 or not math.isfinite(x):
        return ""
    return f" <span class=\"muted\">({x / tol:.2g}\u00d7 tolerance)</span>"


def _metrics(case: dict[str, Any]) -> str:
    extra = case["extra"]
    where = " \u00b7 ".join([case["model"], f"shape {case['shape']}", case["kind"],
                             f"{case['layout']} (world size {case.get('world_size', '?')})", case["backend"],
                             case["dtype"]])
    max_abs = escape(full(case.get("max_abs_err"))) + _verdict(case.get("max_abs_err"), case.get("tolerance"))
    rows = [("case", escape(where)), ("max abs err", max_abs)]
    rows += [(name, escape(full(case.get(key)))) for name, key in _METRIC_ROWS]
    rows.append(("err ratio (vs baseline)", escape(plain(case.get("err_ratio"), ".3g"))))
    if "ssim" in extra or "psnr" in extra:
        ssim, psnr = plain(extra.get("ssim"), ".4f"), plain(extra.get("psnr"), ".2f")
        rows.append(("SSIM / PSNR", f"{escape(ssim)} / {escape(psnr)} dB"))
    rows += [
        ("dispatched", f"<code>{escape(case['dispatched'] or DASH)}</code>"),
        ("seconds", escape(plain(case.get("seconds"), ".3g"))),
        ("peak memory (MB)", _memory(case)),
    ]
    body = "".join(f"<tr><th scope=\"row\">{name}</th><td>{value}</td></tr>" for name, value in rows)
    return f'<table class="metrics">{body}</table>'


def _memory(case: dict[str, Any]) -> str:
    memory = escape(plain(case.get("peak_mem_mb"), ".1f"))
    per_rank = case["extra"].get("peak_mem_mb_per_rank")
    if isinstance(per_rank, list) and per_rank:
        ranks = ", ".join(plain(v, ".1f") for v in per_rank)
        memory += f' <span class="muted">(per rank: {escape(ranks)})</span>'
    return memory


def _reason(case: dict[str, Any]) -> str:
    out = ""
    if case["reason"]:
        out += f'<h4>Reason</h4><pre class="reason">{escape(case["reason"])}</pre>'
    traceback = case["extra"].get("traceback")
    if traceback:
        out += f'<h4>Traceback</h4><pre class="traceback">{escape(str(traceback))}</pre>'
    return out


def safe_relative(path: Any) -> str | None:
    """Images are files beside the report; anything with a scheme, a host or an absolute path is refused."""
    if not isinstance(path, str) or not path or path.startswith(("/", "\\")):
        return None
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or ":" in path.split("/")[0]:
        return None
    return quote(path.replace("\\", "/"), safe="/._-~")


def _images(case: dict[str, Any]) -> str:
    images = case["extra"].get("images")
    if not isinstance(images, dict):
        return ""
    names = [name for name in IMAGE_ORDER if name in images] + [n for n in images if n not in IMAGE_ORDER]
    figures = []
    for name in names:
        src = safe_relative(images[name])
        if src is None:
            continue
        label = escape(name.replace("_", " "))
        figures.append(f'<figure><img src="{escape(src)}" alt="{label} image of {escape(case["case_id"])}" '
                       f'><figcaption>{label}</figcaption></figure>')
    return f'<h4>Images</h4><div class="images">{"".join(figures)}</div>' if figures else ""


def _histogram(case: dict[str, Any]) -> str:
    hist = case["extra"].get("abs_err_hist")
    if not isinstance(hist, dict):
        return ""
    edges = [number(v) for v in hist.get("edges") or []]
    counts = [number(v) for v in hist.get("counts") or []]
    if not counts or len(edges) != len(counts) + 1 or None in edges or None in counts:
        return ""
    return "<h4>Absolute error histogram</h4>" + histogram_svg(edges, counts, number(case.get("tolerance")))


def histogram_svg(edges: list[float], counts: list[float], tolerance: float | None = None) -> str:
    """Inline SVG bars, log-scaled counts (errors pile up in a few bins); a dashed line marks the tolerance."""
    width, height, pad = 420, 140, 22
    bar_w = (width - 2 * pad) / len(counts)
    top = math.log10(1 + max(max(counts), 1))
    bars = []
    for i, count in enumerate(counts):
        h = (height - 2 * pad) * math.log10(1 + max(count, 0)) / top
        x, y = pad + i * bar_w, height - pad - h
        tip = f"[{edges[i]:.2e}, {edges[i + 1]:.2e}): {count:g}"
        bars.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 1, 0.5):.1f}" height="{h:.1f}">'
                    f"<title>{escape(tip)}</title></rect>")
    marker = _tolerance_marker(edges, tolerance, pad, bar_w, height)
    axis = (f'<line class="axis" x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}"/>'
            f'<text x="{pad}" y="{height - 6}">{edges[0]:.1e}</text>'
            f'<text x="{width - pad}" y="{height - 6}" text-anchor="end">{edges[-1]:.1e}</text>'
            f'<text x="{pad}" y="14">count (log scale), max {max(counts):g}</text>')
    return (f'<svg class="hist" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="histogram of absolute error">{"".join(bars)}{axis}{marker}</svg>')


def _tolerance_marker(edges, tolerance, pad, bar_w, height) -> str:
    if tolerance is None or not edges[0] <= tolerance <= edges[-1]:
        return ""
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        if lo <= tolerance <= hi:
            frac = (tolerance - lo) / (hi - lo) if hi > lo else 0.0
            x = pad + (i + frac) * bar_w
            return (f'<line class="tol" x1="{x:.1f}" y1="{pad}" x2="{x:.1f}" y2="{height - pad}"/>'
                    f'<text class="tol" x="{x + 3:.1f}" y="{pad + 10}">tolerance</text>')
    return ""


def _other_extra(case: dict[str, Any]) -> str:
    """Anything else a case recorded, shown as JSON so new fields appear without a report change."""
    rest = {k: v for k, v in case["extra"].items() if k not in _SHOWN_EXTRA}
    if not rest:
        return ""
    rows = "".join(f'<tr><th scope="row">{escape(str(k))}</th><td><code>{escape(_json(v))}</code></td></tr>'
                   for k, v in rest.items())
    return f'<h4>Other data</h4><table class="metrics">{rows}</table>'


def _json(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 2000 else text[:2000] + " \u2026"
