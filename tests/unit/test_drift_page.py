"""What a person sees of a moved reference and of a case run twice (harness.report.moved, static/detail.js), in a
real browser: the banner at the top of the page naming the first moved module, and in an opened case its module
plot with the first moved module ringed, the module tree behind it, and the repeat's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.report import render_html
from harness.report.data import anchor
from harness.run.reference_drift import DRIFT
from harness.run.repeats import REPEATED
from tests.report_pages import case, seen, tensor, write

pytestmark = pytest.mark.slow
LINE = "transformer_blocks.0.attn.norm_q: rel err 1.7e-06 > 1.0e-14 (previous 0.0e+00)"
ROWS = [{"module": "x_embedder", "error": 0.0, "limit": 1e-14},
        {"module": "transformer_blocks.0.attn.norm_q", "error": 1.7e-6, "limit": 1e-14},
        {"module": "transformer_blocks.0.attn", "error": 2e-6, "limit": 1e-14},
        {"module": "(output)", "error": 1.1e-6, "limit": 1e-14}]
MOVED = {"line": LINE, "value": 2e-6, "limit": 1e-14, "derived": "its own noise: captured on this platform",
         "forward": {"modules": ROWS, "first": 1, "line": LINE}}
PROBE = """window.__probe = function () {
  var seen = window.__seen, banner = document.getElementById("moved"), opened = document.querySelector("#opened");
  var ring = opened.querySelector("svg.modules circle.first"), tree = opened.querySelector("details.modules");
  var repeat = opened.querySelector("p.repeat");
  return {banner: banner ? [seen.inView(banner), banner.innerText] : null, ring: ring ? seen.shown(ring) : null,
          first: opened.querySelector(".drift-line code") ? opened.querySelector(".drift-line code").innerText : null,
          tree: tree ? tree.querySelectorAll("tr").length : null, repeat: repeat ? repeat.innerText : null};
};"""


def _page(tmp_path: Path, drift: dict | None) -> Path:
    figures = [*tensor(), DRIFT.of(drift["value"], drift["limit"], drift["derived"])] if drift else tensor()
    record = case("flux/ulysses2/native/fp32/tensor", "PASS", figures=[*figures, REPEATED.of(0.0, 0.0, "bit for bit")],
                  extra={"drift": drift, "repeat": {"max_abs": 0.0, "ranks": [0.0, 0.0], "module": None}}
                  if drift else {})
    return render_html(write(tmp_path, [record]))


def test_a_moved_reference_heads_the_page_and_its_case_draws_the_module_tree(tmp_path):
    got = seen(tmp_path, _page(tmp_path, MOVED), "#" + anchor("flux/ulysses2/native/fp32/tensor"), PROBE)["extra"]
    assert got["banner"][0] and "One device moved off its stored reference" in got["banner"][1]
    assert LINE in got["banner"][1]
    assert got["first"] == LINE and got["ring"] is True
    assert got["tree"] == len(ROWS) + 1  # a row per module, and the header
    assert got["repeat"] == "bit for bit alike on every rank"


def test_a_reference_one_device_stays_on_has_no_banner(tmp_path):
    got = seen(tmp_path, _page(tmp_path, None), "#" + anchor("flux/ulysses2/native/fp32/tensor"), PROBE)["extra"]
    assert got["banner"] is None and got["ring"] is None
