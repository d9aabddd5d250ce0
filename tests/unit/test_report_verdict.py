"""What the page says a verdict stands on, checked where a reviewer reads it, in a real browser: the check that decided
each case (cell title, case panel, its row marked, a limit of 0 read as exact), refusals told from known bugs
(counted and coloured apart, issue groups most severe first, what PASS stands on), flows as rows that explain
themselves, the search over reasons, filters kept when a case opens, links inside a case, and what changed against a
base run."""

from __future__ import annotations

import json

import pytest

from harness.core import figures
from harness.core.results import CaseResult
from harness.kinds.image import MAX_PIXEL, SSIM, VS_MAX, VS_SSIM
from harness.report import render_html
from harness.report.axes import spell
from harness.report.changes import changes
from harness.report.data import anchor
from tests.report_pages import KNOWN, OPEN_ALL, case, known_xfail, seen, tensor, write

NOISE = "2.0 x the noisiest of its 4 single-device bf16 draws (0.0078; image noise_factor)"


def image_bf16() -> dict:
    """A bf16 picture whose key figure (the cell's, SSIM) is not what decided it: the pixel difference to one device
    of its own dtype, at half its limit."""
    found = [SSIM.of(0.99871, 0.99, "fixed, the bf16 entry of image_limits"),
             MAX_PIXEL.of(0.0165, 0.1, "fixed, the bf16 entry of image_limits"),
             VS_SSIM.of(0.99995, 0.9996, NOISE), VS_MAX.of(0.0078, 0.0156, NOISE)]
    return case("flux/ulysses2/native/bf16/image", "PASS", figures=found, deciding=figures.deciding(found))


def train_exact() -> dict:
    """A tp2 training XFAIL decided by ranks that must agree exactly (limit 0)."""
    record = known_xfail()
    record["evidence"] = [*record["evidence"], {"check": "ranks_disagree", "text": "the ranks disagree", "value":
                                                0.0059, "limit": 0.0, "subject": "blocks.0.attn.norm_q.weight",
                                                "known": KNOWN["key"], "band": [1e-3, 2e-2]}]
    record["deciding"] = figures.deciding(record["figures"], record["evidence"])
    return record


DECIDED_PROBE = """window.__probe = function () {
  var s = window.__seen, d = document.querySelector("#opened details.case[open]");
  var decided = d.querySelector("p.decided"), row = d.querySelector("table.figures tr.deciding");
  var ssim = d.querySelector('table.figures tr[data-figure="ssim"] td');
  return {decided: [decided.textContent, s.inView(decided)], row: [row.getAttribute("data-figure"), row.textContent,
            getComputedStyle(row.cells[0]).fontWeight, s.inView(row)], ssimWeight: getComputedStyle(ssim).fontWeight,
          heads: Array.prototype.map.call(d.querySelectorAll("table.figures th"), function (th) {
            return [th.textContent, th.title]; }),
          cells: Array.prototype.map.call(document.querySelectorAll("a.cell-case"), function (a) {
            return [a.getAttribute("data-i"), a.title, a.querySelector(".num").textContent, s.shown(a)]; })};
};"""


@pytest.mark.slow
def test_browser_the_cell_and_the_panel_lead_with_the_deciding_check(tmp_path):
    """A bf16 picture's cell title and opened panel lead with the check that decided it (the pixel difference to one
    device, its share and its limit's derivation), whose row is the bold, marked one, not SSIM (the key figure); a
    training XFAIL held to ranks that agree exactly reads "> 0" and never infx; the columns say what they hold."""
    wanted = "flux/ulysses2/native/bf16/image"
    index = render_html(write(tmp_path / "run", [image_bf16(), train_exact()]))
    got = seen(tmp_path, index, f"#case-{wanted}", OPEN_ALL + DECIDED_PROBE)
    assert got["firstOpen"] == [anchor(wanted), True]
    probe = got["extra"]
    text, in_view = probe["decided"]
    assert in_view and text == ("Decided by max pixel diff to one device, same dtype 0.0078 <= 0.0156 (0.50x of its "
                                f"allowance; limit: {NOISE})")
    name, row, weight, row_in_view = probe["row"]
    assert name == "vs_baseline_max_abs" and "\u25c0 decided" in row and int(weight) >= 600 and row_in_view
    assert int(probe["ssimWeight"]) < 600  # the key figure is not what decided it: not the bold row
    assert all(title for _, title in probe["heads"]) and "share of its allowance" in dict(probe["heads"])
    (image_cell, train_cell) = sorted(probe["cells"])
    assert image_cell[1].startswith("decided by max pixel diff to one device, same dtype 0.0078 <= 0.0156 (0.50x")
    assert NOISE in image_cell[1] and image_cell[2] == "pixel 1-dev 0.50x" and image_cell[3]
    assert train_cell[2] == "ranks disagree 0.0059 > 0" and "exact: any difference from 0 fails" in train_cell[1]
    assert "inf" not in train_cell[1] + train_cell[2]
    train = seen(tmp_path / "t", index, f"#case-{anchor('flux/tp2/native/fp32/train')[5:]}", DECIDED_PROBE.replace(
        'd.querySelector("table.figures tr.deciding")', 'd.querySelector("table.evidence tr.deciding")').replace(
        "row.getAttribute(\"data-figure\")", "row.getAttribute(\"data-check\")").replace(
        'd.querySelector(\'table.figures tr[data-figure="ssim"] td\')', "d.querySelector(\"td\")"))["extra"]
    assert train["decided"][0] == ("Decided by ranks disagree [blocks.0.attn.norm_q.weight] 0.0059 > 0 (exact: any "
                                   "difference from 0 fails)")
    assert train["row"][0] == "ranks_disagree" and "\u25c0 decided" in train["row"][1]


def refusal_cases() -> list[dict]:
    """Two refusals (one the plan predicted, one a refusal entry excused), three known bugs (two silently wrong, one
    crash), a pass."""
    plan_refusal = case("flux/ulysses2/flex/fp32/tensor", "REFUSED", figures=[],
                        reason="expected refusal: diffusers does not register backend 'flex' as context-parallel "
                               "capable; observed ERROR: rank 0: NotImplementedError: flex does not support it",
                        evidence=[{"check": "error", "text": "rank 0: NotImplementedError: flex does not support it",
                                   "refused": "diffusers does not register backend 'flex' as context-parallel "
                                              "capable"}])
    entry = {"key": "known_issues.toml #1", "title": "native SDPA cannot serve ring attention", "link": "",
             "severity": "refusal"}
    entry_refusal = case("flux/ring2/native/fp32/tensor", "REFUSED", figures=[], known_issues=[entry],
                         reason="expected refusal: native SDPA cannot return the log-sum-exp; observed ERROR: "
                                "ValueError: return_lse", evidence=[{"check": "error", "text": "ValueError: return_lse",
                                                                    "known": entry["key"]}])
    crash_entry = {"key": "known_issues.toml #9", "title": "LTX2 RoPE not split", "link": "", "severity": "crash"}
    crash = case("flux/ulysses4/native/fp32/tensor", "XFAIL", figures=[], known_issues=[crash_entry],
                 reason="known issue: RoPE; observed ERROR: RuntimeError: must match the size of tensor b",
                 evidence=[{"check": "error", "text": "RuntimeError: must match", "known": crash_entry["key"]}])
    return [case("flux/ulysses2/native/fp32/tensor", "PASS"), crash, plan_refusal, known_xfail(),
            known_xfail("flux/tp4/native/fp32/train"), entry_refusal]


REFUSAL_PROBE = """window.__probe = function () {
  var s = window.__seen, stands = document.getElementById("stands-on");
  function colour(sel) { var el = document.querySelector(sel); return getComputedStyle(el).backgroundColor; }
  var d = document.querySelector("#opened details.case[open]");
  return {stands: [stands.textContent, s.inView(stands)],
          counts: [document.querySelector('[data-set-status="REFUSED"]').textContent,
                   document.querySelector('[data-set-status="XFAIL"]').textContent],
          colours: [colour('.count[data-set-status="REFUSED"]'), colour('.count[data-set-status="XFAIL"]'),
                    colour('a.cell-case.s-REFUSED'), colour('a.cell-case.s-XFAIL')],
          groups: Array.prototype.map.call(document.querySelectorAll("#known-issues details.group > summary"),
            function (g) { return [g.querySelector(".severity").textContent, g.querySelector(".n").textContent,
                                   s.shown(g.querySelector(".severity"))]; }),
          excused: Array.prototype.map.call(d.querySelectorAll("table.evidence tbody tr"), function (tr) {
            return tr.cells[5].textContent; })};
};"""


@pytest.mark.slow
def test_browser_refusals_and_known_bugs_are_counted_coloured_and_listed_apart(tmp_path):
    """REFUSED (diffusers refusing as expected) has its own count and colour beside XFAIL (known bugs); the first
    screen says what PASS stands on; the issue groups run silently wrong, crash, refusal; a refusal's failed check is
    excused by the refusal, not left blank as if unexcused."""
    wanted = "flux/ulysses2/flex/fp32/tensor"
    index = render_html(write(tmp_path / "run", refusal_cases()))
    got = seen(tmp_path, index, f"#case-{wanted}", OPEN_ALL + REFUSAL_PROBE)["extra"]
    assert got["stands"] == ["Passes on 0 new failures; 2 known silently wrong results in diffusers, 1 known crash, "
                             "2 expected refusals (diffusers refusing what it does not support) (listed below, most "
                             "severe first)", True]
    assert got["counts"] == ["2REFUSED", "3XFAIL"]
    refused_count, xfail_count, refused_cell, xfail_cell = got["colours"]
    assert refused_count == refused_cell != xfail_count == xfail_cell, got["colours"]
    assert [kind for kind, _, _ in got["groups"]] == ["silently wrong", "crash", "refusal", "refusal"]
    assert all(shown for _, _, shown in got["groups"])
    assert got["excused"] == ["expected refusal: diffusers does not register backend 'flex' as context-parallel "
                              "capable"]


def flow_records() -> list[dict]:
    records = []
    for layout in ("ulysses2", "tp2"):
        for kind in ("tensor", "image"):
            for flow in ("none", "processor", "processor_after"):
                record = case(f"flux/{layout}/native/fp32/{kind}", "PASS", flow=flow)
                record["case_id"] = spell(record)
                records.append(record)
    return records


HELP = {"flow": {"none": "nothing called around enable_parallelism",
                 "processor": "model.set_attn_processor(...); called before enable_parallelism",
                 "processor_after": "model.set_attn_processor(...); called after enable_parallelism"}}
FLOW_PROBE = """document.querySelectorAll("details.values-legend").forEach(function (d) { d.open = true; });
window.__probe = function () {
  var s = window.__seen;
  return {rows: Array.prototype.map.call(document.querySelectorAll("table.matrix tbody th"), function (th) {
            return [th.innerText.replace(/\\s+/g, " ").trim(), th.title, s.shown(th)]; }),
          heads: Array.prototype.map.call(document.querySelectorAll("table.matrix thead th[data-col]"), function (th) {
            return th.innerText.replace(/\\s+/g, " ").trim(); }),
          legend: Array.prototype.map.call(document.querySelectorAll('details.values-legend[data-axis="flow"] dd'),
            function (dd) { return [dd.textContent, s.shown(dd)]; })};
};"""


@pytest.mark.slow
def test_browser_a_flow_is_a_row_under_its_layout_that_says_which_call_and_when(tmp_path):
    """Flows are rows under their layout's (the columns stay the kinds and dtypes: flux's matrix is not a column per
    flow), each titled with its calls and whether they come before or after enable_parallelism, and a legend says
    the same for every flow of the run."""
    index = render_html(write(tmp_path / "run", flow_records(), values_help=HELP))
    got = seen(tmp_path, index, "", OPEN_ALL + FLOW_PROBE)["extra"]
    assert got["heads"] == ["tensor eager", "image eager"]  # a column per kind (and mode), none per flow
    labels = [label for label, _, _ in got["rows"]]
    assert labels == ["ulysses2 native", "ulysses2 native \u21b3 processor", "ulysses2 native \u21b3 processor_after",
                      "tp2 native", "tp2 native \u21b3 processor", "tp2 native \u21b3 processor_after"]
    titles = dict((label, title) for label, title, _ in got["rows"])
    assert titles["ulysses2 native \u21b3 processor_after"] == HELP["flow"]["processor_after"]
    assert titles["ulysses2 native"] == ""  # no flow: no call to explain
    assert [text for text, shown in got["legend"] if shown] == list(HELP["flow"].values())


SEARCH_PROBE = OPEN_ALL + """window.__probe = function () {
  return Array.prototype.filter.call(document.querySelectorAll("tr.case-row"), window.__seen.shown).map(
    function (tr) { return decodeURIComponent(tr.querySelector("a").getAttribute("href").slice(6)); }).sort();
};"""


@pytest.mark.slow
@pytest.mark.parametrize(("query", "wanted"), [
    ("expected%20refusal", ["flux/ring2/native/fp32/tensor", "flux/ulysses2/flex/fp32/tensor"]),
    ("NotImplementedError", ["flux/ulysses2/flex/fp32/tensor"]),
    ("silently%20wrong", ["flux/tp2/native/fp32/train", "flux/tp4/native/fp32/train"]),  # an entry's kind
    ("no%20such%20words", []),
])
def test_browser_search_finds_a_case_by_its_reason_and_its_known_issue(tmp_path, query, wanted):
    got = seen(tmp_path, render_html(write(tmp_path / "run", refusal_cases())), f"?q={query}", SEARCH_PROBE)
    assert got["extra"] == wanted


KEEP_PROBE = """setTimeout(function () {
  window.__hash = location.hash;
  document.querySelector("#opened details.case[open] a.entry-key").click();
}, 100);
window.__wait = 600;
window.__probe = function () {
  var s = window.__seen, d = document.querySelector("#opened details.case");
  return {status: document.querySelector("select[name=status]").value, hashBefore: window.__hash,
          hashAfter: location.hash, open: d ? [d.id, d.open, s.shown(d)] : null,
          note: d ? s.shown(d.querySelector(".hidden-note")) : null,
          listed: s.inView(document.getElementById("issue-13"))};
};"""


@pytest.mark.slow
def test_browser_opening_a_case_keeps_the_filters_and_a_link_inside_keeps_it_open(tmp_path):
    """A link to a case the filters hide opens it and leaves the filters as they were (the case marked as hidden in
    the lists); a link inside the opened case (its known issue's listing) goes there without closing the case or
    changing the URL's case."""
    wanted = "flux/tp2/native/fp32/train"
    got = seen(tmp_path, render_html(write(tmp_path / "run", refusal_cases())), f"?status=PASS#case-{wanted}",
               KEEP_PROBE)
    assert got["firstOpen"][0] == anchor(wanted)
    probe = got["extra"]
    assert probe["status"] == "PASS" and got["counter"] == "Showing 1 of 6 cases"
    assert probe["open"] == [anchor(wanted), True, True] and probe["note"]
    assert probe["hashBefore"] == probe["hashAfter"] == f"#{anchor(wanted)}" and probe["listed"]


def _changed_runs(tmp_path):
    base = [case("flux/ulysses2/native/fp32/tensor", "PASS"), case("flux/ring2/_native_flash/fp32/tensor", "FAIL",
                                                                   figures=tensor(0.02)),
            case("flux/tp2/native/fp32/tensor", "PASS", figures=tensor(1e-7), deciding={
                "name": "max_abs_err", "label": "max abs err", "short": "err", "value": 1e-7, "limit": 1e-5,
                "bound": "<=", "margin": 0.01, "text": "t"})]
    now = [case("flux/ulysses2/native/fp32/tensor", "FAIL", figures=tensor(0.03), reason="max abs err 0.03 > 1e-05"),
           case("flux/ring2/_native_flash/fp32/tensor", "PASS"),
           case("flux/tp2/native/fp32/tensor", "PASS", figures=tensor(8e-6), deciding={
               "name": "max_abs_err", "label": "max abs err", "short": "err", "value": 8e-6, "limit": 1e-5,
               "bound": "<=", "margin": 0.8, "text": "t"}),
           case("flux/ring4/_native_flash/fp32/tensor", "PASS")]
    return write(tmp_path / "base", base), write(tmp_path / "now", now, settings={"compare_with": str(tmp_path /
                                                                                                       "base")})


def test_what_changed_against_a_base_run_is_each_case_s_kind_of_change(tmp_path):
    """A new failure, a fix, a figure that moved by 0.1x of its allowance or more, a new case; a case the same in both
    (none here besides) is no change; the page's data and first screen carry them (the run's own --compare-with)."""
    base, now = _changed_runs(tmp_path)
    from harness.core.results import read_results

    found = changes(read_results(base / "results.json")[1], read_results(now / "results.json")[1])
    assert found == {0: ["new failure", "PASS", "1.7e-07"], 1: ["fixed", "FAIL", "2.0e-02"],
                     2: ["figure", "PASS", "err 0.01x"], 3: ["new case", "", ""]}
    page = render_html(now).read_text()
    assert "1 new failure, 1 fixed, 1 changed figure, 1 new case" in page
    same = CaseResult.from_dict(case("a/ring2/native/fp32/tensor", "PASS"))
    assert changes([same], [same]) == {}  # the control: nothing changed, nothing marked


CHANGE_PROBE = """window.__probe = function () {
  var s = window.__seen, line = document.getElementById("changes-line");
  return {line: [line.textContent, s.inView(line)],
          marks: Array.prototype.map.call(document.querySelectorAll("a.cell-case"), function (a) {
            var mark = a.querySelector(".chg");
            return [decodeURIComponent(a.getAttribute("href").slice(6)), mark ? mark.textContent : null,
                    mark ? s.shown(mark) : false, a.title.split("\\n").pop()]; }).sort(),
          opened: document.querySelector("#opened p.changed").textContent};
};"""


@pytest.mark.slow
def test_browser_the_page_marks_what_changed_per_cell(tmp_path):
    """Given a base run, each changed cell shows a mark of its kind (a new failure, a fix, a changed figure, a new
    case) and its title says what it was; the first screen counts them; an opened case says it too."""
    _, now = _changed_runs(tmp_path)
    got = seen(tmp_path, render_html(now), "", OPEN_ALL + CHANGE_PROBE)["extra"]
    assert got["line"][1] and "1 new failure, 1 fixed, 1 changed figure, 1 new case" in got["line"][0]
    assert got["marks"] == [
        ["flux/ring2/_native_flash/fp32/tensor", "\u2713", True, "against the base run: fixed (was FAIL 2.0e-02)"],
        ["flux/ring4/_native_flash/fp32/tensor", "+", True, "against the base run: new case"],
        ["flux/tp2/native/fp32/tensor", "\u0394", True, "against the base run: figure (was PASS err 0.01x)"],
        ["flux/ulysses2/native/fp32/tensor", "\u25b2", True, "against the base run: new failure (was PASS 1.7e-07)"]]
    assert got["opened"] == "Against the base run: \u25b2 new failure (was PASS 1.7e-07)"
    assert json.loads(json.dumps(got))  # plain data all through
