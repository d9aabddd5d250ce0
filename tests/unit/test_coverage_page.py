"""The page's coverage section as a person sees it in a real Chromium: the table of modules with their figures, the
uncovered functions of a module once it is opened (each linked to its lines in diffusers' source, each reason with
its lines), and nothing of it on a page of a run that did not measure coverage. Plus its size on a full plan."""

from __future__ import annotations

import pytest

from harness.core.coverage import CUDA_ONLY, NOT_IN_PLAN, REFUSED, UNKNOWN, CoverageReport, FunctionCoverage, Gap
from harness.core.coverage import ModuleCoverage as Module
from harness.report import render_html
from tests.report_pages import cases, seen, write

SOURCE = "https://github.com/huggingface/diffusers/blob/v0.42.1/src/diffusers/hooks/context_parallel.py"
PROBE = """window.__probe = function () {
  function shown(el) {  // checkVisibility: the content of a closed <details> keeps its box but is not rendered
    var b = el.getBoundingClientRect();
    return el.checkVisibility() && getComputedStyle(el).display !== "none" && b.width > 0 && b.height > 0; }
  var section = document.getElementById("coverage");
  if (!section) { return null; }
  return {
    section: shown(section),
    rows: Array.prototype.map.call(section.querySelectorAll("tr[data-module]"), function (tr) {
      return [tr.getAttribute("data-module"), shown(tr), Array.prototype.map.call(tr.querySelectorAll("td.n"),
        function (td) { return td.textContent; })]; }),
    functions: Array.prototype.map.call(section.querySelectorAll(".function"), function (f) {
      var a = f.querySelector("a");
      return [f.getAttribute("data-function"), shown(f), a.getAttribute("href"), shown(a),
              Array.prototype.map.call(f.querySelectorAll("li"), function (li) { return li.textContent; })]; }),
    unknownColour: (function () { var u = section.querySelector(".g-unknown");
      return u ? getComputedStyle(u).backgroundColor : null; })()
  };
};"""


def report() -> CoverageReport:
    functions = [
        FunctionCoverage("remove_context_parallel", 112, 126, [113, 114, 115], [],
                         [Gap([113, 114], NOT_IN_PLAN, "the kind `removal`"),
                          Gap([115], REFUSED, 'ValueError: "Unsupported context parallel model plan type: {...}"')]),
        FunctionCoverage("ContextParallelSplitHook.pre_forward", 141, 185, [142, 144, 146], [142, 144],
                         [Gap([146], UNKNOWN, "nothing the harness knows reaches it")]),
        FunctionCoverage("apply_context_parallel", 80, 109, [86, 88], [86, 88]),
        FunctionCoverage("_cudnn_op", 200, 220, [201], [], [Gap([201], CUDA_ONLY, "only `_native_cudnn` reach it")]),
    ]
    return CoverageReport("0.42.1", [Module("hooks/context_parallel.py", "context-parallel hooks", functions,
                                            source=SOURCE),
                                     Module("hooks/tensor_parallel.py", "tp", absent="this diffusers has none")],
                          processes=5)


@pytest.mark.slow
def test_browser_the_coverage_section_shows_the_modules_and_opens_to_the_uncovered_functions(tmp_path):
    index = render_html(write(tmp_path / "run", cases(), coverage=report().to_dict()))
    closed = seen(tmp_path, index, setup=PROBE)["extra"]
    assert closed["section"]
    assert closed["rows"] == [["hooks/context_parallel.py", True, ["9", "4", "44.4 %", "1", "1", "2", "1"]]]
    assert not any(shown for _, shown, *_ in closed["functions"])  # inside a closed module until it is opened
    opened = seen(tmp_path, index, setup='document.querySelectorAll("#coverage details").forEach(function (d) '
                                         '{ d.open = true; });' + PROBE)["extra"]
    functions = {name: rest for name, *rest in opened["functions"]}
    assert list(functions)[0] == "ContextParallelSplitHook.pre_forward"  # the unknown gap first
    assert "apply_context_parallel" not in functions  # wholly executed: nothing to say
    shown, href, link_shown, gaps = functions["remove_context_parallel"]
    assert shown and link_shown and href == f"{SOURCE}#L112-L126"
    assert gaps == ["not in this plan L113-114: the kind `removal`",
                    'refused by diffusers L115: ValueError: "Unsupported context parallel model plan type: {...}"']
    assert opened["unknownColour"] == "rgb(255, 235, 233)"  # an unknown gap stands out


def test_a_run_without_coverage_says_so_and_a_full_plan_page_stays_in_budget(tmp_path):
    plain = render_html(write(tmp_path / "plain", cases())).read_text()
    section = plain.split('<section id="coverage">', 1)[1].split("</section>", 1)[0]
    assert "Not measured: this run did not use <code>--coverage</code>" in section and "<table" not in section
    big = report()
    module = big.modules[0]
    module.functions = [FunctionCoverage(f"function_{n}", 10 * n, 10 * n + 9, list(range(10 * n, 10 * n + 8)),
                                         [10 * n], [Gap(list(range(10 * n + 1, 10 * n + 8)), UNKNOWN, "x" * 200)])
                        for n in range(100)]  # more uncovered functions than the full plan leaves (docs/measured.md)
    with_coverage = render_html(write(tmp_path / "big", cases(), coverage=big.to_dict())).stat().st_size
    without = render_html(write(tmp_path / "plain", cases())).stat().st_size
    assert with_coverage - without < 55_000, with_coverage - without  # within the page's budget (docs/reports.md)
