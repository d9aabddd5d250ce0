"""Inline CSS and the page shell for the report pages; kept in Python so they ship with the package without
package-data setup. The index page's script is in script.py."""

from html import escape

CSS = r"""
:root { --pass:#1a7f37; --fail:#cf222e; --error:#bc4c00; --timeout:#8250df; --skip:#57606a; --xfail:#9a6700;
  --pass-bg:#dafbe1; --fail-bg:#ffebe9; --error-bg:#ffe2c6; --timeout-bg:#f3e8ff; --skip-bg:#eaeef2;
  --xfail-bg:#fff3b0; --xpass:#0550ae; --xpass-bg:#ddf4ff; --line:#d0d7de; --muted:#57606a; --focus:#0969da; }
* { box-sizing: border-box; }
/* The filters hide with the hidden attribute; without !important any rule that sets display (.cell-case's block)
   would win over the browser's own [hidden] rule and keep filtered cells on screen. */
[hidden] { display: none !important; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1f2328;
  margin: 0 auto; padding: 16px 24px 48px; max-width: 1600px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 2px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line);
  padding-bottom: 4px; } h4 { margin: 14px 0 4px; font-size: 13px; }
code, pre { font-family: ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, monospace; font-size: 12.5px; }
.muted, .sub { color: var(--muted); }
a { color: #0550ae; }
:focus-visible { outline: 3px solid var(--focus); outline-offset: 1px; }
table { border-collapse: collapse; }
th, td { text-align: left; vertical-align: top; }
.banner { border: 2px solid var(--error); background: var(--error-bg); padding: 10px 14px; border-radius: 6px;
  margin: 12px 0; font-weight: 600; }
.env { font-size: 13px; } .env th, .env td { border-bottom: 1px solid var(--line); padding: 3px 14px 3px 0; }
.env tr.differs td { background: var(--error-bg); font-weight: 600; }
.env-note { margin: 6px 0; }
.counts { display: flex; flex-wrap: wrap; gap: 8px; margin: 6px 0; }
.count { border: 1px solid var(--line); border-radius: 6px; padding: 4px 10px; font: inherit; cursor: pointer;
  background: #fff; }
.count b { font-size: 16px; margin-right: 4px; }
.badge { display: inline-block; border-radius: 4px; padding: 0 6px; font-weight: 700; font-size: 12px; }
.s-PASS { --c: var(--pass); --bg: var(--pass-bg); } .s-FAIL { --c: var(--fail); --bg: var(--fail-bg); }
.s-ERROR { --c: var(--error); --bg: var(--error-bg); } .s-TIMEOUT { --c: var(--timeout); --bg: var(--timeout-bg); }
.s-SKIP { --c: var(--skip); --bg: var(--skip-bg); } .s-XFAIL { --c: var(--xfail); --bg: var(--xfail-bg); }
.s-XPASS { --c: var(--xpass); --bg: var(--xpass-bg); }
.badge, .cell-case, .count { color: var(--c, #1f2328); background: var(--bg, #fff);
  border-left: 4px solid var(--c, #888); }
#filters { position: sticky; top: 0; z-index: 3; background: #f6f8fa; border: 1px solid var(--line);
  border-radius: 6px; padding: 8px 12px; display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; }
#filters label { display: inline-flex; gap: 6px; align-items: center; font-size: 13px; }
#filters select, #filters button { font: inherit; font-size: 13px; padding: 2px 4px; }
#shown-count { margin-left: auto; font-size: 13px; color: var(--muted); }
.js .nojs { display: none; }
.scroll { overflow-x: auto; max-width: 100%; border: 1px solid var(--line); border-radius: 6px; }
table.matrix { font-size: 12px; }
.matrix th, .matrix td { border: 1px solid var(--line); padding: 2px; }
.matrix thead th { background: #f6f8fa; text-align: center; font-weight: 600; white-space: nowrap; padding: 4px 6px; }
.matrix thead th span { display: block; } .matrix thead th .dtype { font-weight: 400; color: var(--muted); }
.matrix th[scope=row] .backend { color: var(--muted); }
.matrix th[scope=row] { background: #f6f8fa; white-space: nowrap; padding: 4px 8px; position: sticky; left: 0;
  z-index: 1; }
.matrix td.empty { background: repeating-linear-gradient(45deg, #fff, #fff 4px, #f3f4f6 4px, #f3f4f6 8px); }
.cell-case { display: block; text-decoration: none; padding: 2px 5px; min-width: 70px; border-radius: 3px;
  text-align: center; line-height: 1.25; }
.cell-case + .cell-case { margin-top: 2px; }
.cell-case b { display: block; font-size: 11px; letter-spacing: .02em; }
.cell-case .num { color: #1f2328; font-variant-numeric: tabular-nums; white-space: nowrap; }
.cell-case:hover { filter: brightness(0.95); text-decoration: underline; }
.legend { display: flex; gap: 6px; flex-wrap: wrap; margin: 4px 0 8px; font-size: 12px; }
table.cases { width: 100%; font-size: 12.5px; }
.cases th, .cases td { border-bottom: 1px solid var(--line); padding: 4px 6px; }
.cases thead th { background: #f6f8fa; position: sticky; top: 0; }
.cases td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.cases .reason-cell { max-width: 60ch; min-width: 24ch; white-space: pre-wrap; overflow-wrap: anywhere;
  display: -webkit-box; -webkit-line-clamp: 3; -webkit-box-orient: vertical; overflow: hidden; }
nav.jump { font-size: 13px; margin-top: 4px; }
details.group, details.model { border: 1px solid var(--line); border-radius: 6px; margin: 4px 0; }
details.group > summary, details.model > summary { cursor: pointer; padding: 5px 10px; background: #f6f8fa;
  border-radius: 6px; }
details.group[open] > summary, details.model[open] > summary { border-bottom: 1px solid var(--line);
  border-radius: 6px 6px 0 0; }
details.group > summary { border-left: 4px solid var(--c, #888); }
details.group > summary .n { display: inline-block; min-width: 5ch; text-align: right; margin-right: 6px;
  font-variant-numeric: tabular-nums; }
details.group > summary .why { white-space: pre-wrap; overflow-wrap: anywhere; }
.group-body, .model-body { padding: 6px 10px 10px; }
.model-name { font-size: 15px; margin-right: 6px; } details.model > summary .badge { margin-left: 4px; }
#details { border: 2px solid var(--focus); border-radius: 8px; padding: 0 12px 8px; margin: 16px 0; }
#details > h2 { border: 0; margin-top: 10px; }
.case-body > .close { float: right; font: inherit; font-size: 12px; margin: 4px 0 0 8px; }
.scale { display: flex; flex-direction: column; width: 224px; margin-top: 4px; }
.scale .bar { display: block; height: 10px; border: 1px solid var(--line);
  background: linear-gradient(to right, #000, #fff); }
.scale .ticks { display: flex; justify-content: space-between; font-size: 11px; color: var(--muted); }
.scale-note { width: 224px; font-size: 11px; color: var(--muted); margin: 2px 0 0; }
details.case { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; }
details.case > summary { cursor: pointer; padding: 6px 10px; background: #f6f8fa; border-radius: 6px; }
details.case[open] > summary { border-bottom: 1px solid var(--line); border-radius: 6px 6px 0 0; }
details.case:target { box-shadow: 0 0 0 3px var(--focus); }
.case-body { padding: 6px 12px 12px; }
.metrics th { font-weight: 600; padding: 2px 16px 2px 0; white-space: nowrap; }
.metrics td { padding: 2px 0; overflow-wrap: anywhere; } .metrics td code { white-space: pre-wrap; }
pre.reason, pre.traceback { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f8fa;
  border: 1px solid var(--line); border-radius: 4px; padding: 8px; margin: 0; max-height: 32em; overflow: auto; }
.images { display: flex; flex-wrap: wrap; gap: 12px; }
.images figure { margin: 0; } .images img { width: 224px; max-width: 100%; height: auto; border: 1px solid var(--line);
  image-rendering: pixelated; display: block; }
.images figcaption { font-size: 12px; color: var(--muted); text-align: center; }
svg.hist rect { fill: #0969da; } svg.hist text { font-size: 10px; fill: var(--muted); }
svg.hist .axis { stroke: #8c959f; } svg.hist line.tol { stroke: var(--fail); stroke-dasharray: 4 3; }
svg.hist text.tol { fill: var(--fail); }
svg.loss polyline { fill: none; stroke-width: 2; } svg.loss text { font-size: 10px; fill: var(--muted); }
svg.loss .axis { stroke: #8c959f; } svg.loss .ref polyline { stroke: #1a7f37; stroke-dasharray: 5 3; }
svg.loss .run polyline { stroke: #0969da; } svg.loss .base polyline { stroke: #bf8700; }
svg.loss .ref circle, svg.loss text.ref { fill: #1a7f37; } svg.loss .run circle, svg.loss text.run { fill: #0969da; }
svg.loss .base circle, svg.loss text.base { fill: #bf8700; }
svg.modules polyline { fill: none; } svg.modules polyline.err { stroke: #0969da; stroke-width: 1.5; }
svg.modules polyline.lim { stroke: var(--fail); stroke-dasharray: 4 3; } svg.modules text { font-size: 10px; }
svg.modules text { fill: var(--muted); } svg.modules text.err { fill: #0969da; }
svg.modules text.lim { fill: var(--fail); }
svg.modules circle.first { fill: none; stroke: var(--fail); stroke-width: 2.5; } svg.modules .axis { stroke: #8c959f; }
tr.diverged td { background: #ffebe9; font-weight: 600; }
.none { padding: 12px; color: var(--muted); }
ul.patterns { margin: 4px 0 8px; padding-left: 20px; overflow-wrap: anywhere; font-size: 12.5px; }
@media print {
  @page { margin: 12mm; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  body { padding: 0; max-width: none; font-size: 11px; }
  #filters { display: none; }
  .cases td code { overflow-wrap: anywhere; }
  .scroll { overflow: visible; border: 0; }
  .matrix th[scope=row], #filters, .cases thead th { position: static; }
  .cases .reason-cell { display: block; -webkit-line-clamp: unset; overflow: visible; }
  details.case { break-inside: avoid; }
  nav.jump, .case-body > .close { display: none; }
  details.case::details-content { content-visibility: visible; display: block; }
  details.case > summary { list-style: none; }
  pre.reason, pre.traceback { max-height: none; overflow: visible; }
  a { color: inherit; text-decoration: none; }
}
"""

def page(title: str, body: str, script: str = "") -> str:
    """The shell of index.html and compare.html: inline CSS/JS only, so a file works from disk or a CI artifact."""
    js = f"<script>{script}</script>" if script else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>{body}{js}</body></html>\n"
    )
