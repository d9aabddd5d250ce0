"""The page keeps a reviewer's place, in a real browser: a case opens in a panel beside the page and closing it
returns to the cell it was opened from; the filters, the search and the open case live in the URL (Back, Forward
and a shared link bring them back); the search finds cases and known-issue entries; filtered summaries count what
is shown; the matrix's held header row stays below the sticky filter bar; known-issue entries are listed, linked
and traceable upstream, the unmatched ones too; the first screen gives the verdict and the run's setup."""

from __future__ import annotations

import pytest

from harness.report import render_html
from harness.report.data import anchor
from tests.report_pages import KNOWN, case, known_xfail, seen, write
from tests.unit.test_report_html import browser_cases, run, wide_cases

pytestmark = pytest.mark.slow
OPENED = "flux/ring2/native/bf16/tensor"  # a PASS cell of browser_cases' flux matrix
# Every group and matrix section opened, each with the toggle event a browser sends (headless Chromium's virtual
# time may send it late: the steps below must find the matrix drawn)
OPEN_ALL = ('document.querySelectorAll("details.group, details.section").forEach(function (d) { d.open = true;'
            ' d.dispatchEvent(new Event("toggle")); });')

# Opens the matrix, brings a cell to the middle of a short window, clicks it, then closes the case it opened;
# records where the cell was, what the panel showed, and where focus and the cell are after closing.
PLACE_SETUP = OPEN_ALL + """var log = window.__log = {}, s = window.__seen;
setTimeout(function () {
  var cell = document.querySelector('a.cell-case[href="#case-OPENED"]'), pane = document.getElementById("details");
  cell.scrollIntoView({block: "center"});
  log.before = [s.box(cell), window.scrollY];
  cell.click();
  var b = cell.getBoundingClientRect(), hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
  log.open = [s.shown(pane), document.querySelector("#opened details.case").id, decodeURIComponent(location.hash),
              pane.getBoundingClientRect().left >= b.right, cell.contains(hit),
              document.activeElement === document.querySelector("#opened details.case summary")];
  setTimeout(function () {
    document.querySelector("#opened [data-close]").click();
    log.closed = [s.shown(pane), document.activeElement === cell, s.box(cell), window.scrollY, location.hash];
  }, 40);
}, 40);
window.__probe = function () { return window.__log; };
window.__wait = 1500;""".replace("OPENED", OPENED)


def test_closing_a_case_returns_to_the_cell_it_was_opened_from(tmp_path):
    """The page had scrolled to the cell (so returning means something); the case opened in a panel to the right
    of the cell (the page narrowing to make room), which stays in view and uncovered, focus in the case; closing it
    leaves the panel hidden, focus on the same cell at the same place, and the URL without the case. (The filter
    keeps the first failure from opening at load, so the panel is opened by the click.)"""
    got = seen(tmp_path, run(tmp_path), "?status=PASS", PLACE_SETUP, window=(1280, 600))["extra"]
    (box, scrolled) = got["before"]
    assert scrolled > 100, got
    assert got["open"] == [True, anchor(OPENED), "#" + anchor(OPENED), True, True, True], got
    shown, focused, after, scrolled_after, fragment = got["closed"]
    assert not shown and focused and fragment == "", got
    assert scrolled_after == pytest.approx(scrolled, abs=1) and after == pytest.approx(box, abs=1), got


# Filters by status (a new history entry), opens a case (another), then goes Back twice and Forward once.
HISTORY_SETUP = OPEN_ALL + """var log = window.__log = {}, form = document.getElementById("filters");
function now() {
  return [location.search, decodeURIComponent(location.hash), form.elements.status.value,
          window.__seen.shown(document.getElementById("details"))];
}
// Each step of the history is recorded once the page has handled it (its own popstate listener runs first), not
// after a fixed delay: a busy machine takes longer to go back.
function step(go, name, next) {
  window.addEventListener("popstate", function once() {
    window.removeEventListener("popstate", once);
    setTimeout(function () { log[name] = now(); next(); }, 0);
  });
  go();
}
setTimeout(function () {
  form.elements.status.value = "PASS";
  form.dispatchEvent(new Event("change"));
  log.filtered = now();
  document.querySelector('a.cell-case[href="#case-OPENED"]').click();
  log.opened = now();
  step(function () { history.back(); }, "back", function () {
    step(function () { history.back(); }, "back2", function () {
      step(function () { history.forward(); }, "forward", function () {});
    });
  });
}, 40);
window.__probe = function () { return window.__log; };
window.__wait = 1500;""".replace("OPENED", OPENED)


def test_filters_and_the_open_case_live_in_the_url(tmp_path):
    """Each filter change and each opened case is a history entry: Back puts the case opened before back on top and
    keeps the filter, Back again clears the filter (and the panel, as the page was loaded), Forward brings them back.
    A filter does not close an opened case (the first failure, opened on loading, stays on top through the filter
    change). A shared link of that URL opens the page as it was."""
    index = run(tmp_path)
    got = seen(tmp_path, index, "", HISTORY_SETUP)["extra"]
    shown, first = "#" + anchor(OPENED), "#" + anchor(browser_cases()[0]["case_id"])
    assert got["filtered"][:3] == ["?status=PASS", first, "PASS"], got
    assert got["opened"] == ["?status=PASS", shown, "PASS", True], got
    assert got["back"] == ["?status=PASS", first, "PASS", True], got
    assert got["back2"] == ["", "", "", False], got
    assert got["forward"] == ["?status=PASS", first, "PASS", True], got
    shared = seen(tmp_path, index, f"?status=PASS&q=ring2{shown}")
    passing = [c for c in browser_cases() if c["status"] == "PASS" and "ring2" in c["case_id"]]
    assert shared["firstOpen"] == [anchor(OPENED), True]
    assert shared["counter"] == f"Showing {len(passing)} of {len(browser_cases())} cases"
    assert {key for key, shown_ in shared["cells"].items() if shown_} == {anchor(c["case_id"]) for c in passing}


def known_records() -> list[dict]:
    """Two XFAILs of an entry with an upstream thread, one of another entry, and a failure whose reason holds an
    address next to markup."""
    threaded = dict(KNOWN, upstream="https://github.com/huggingface/diffusers/issues/12706")
    other = dict(KNOWN, key="known_issues.toml #4", title="ring refuses odd lengths", link="")
    return [known_xfail(entry=threaded), known_xfail("flux/tp4/native/fp32/train", threaded),
            known_xfail("qwenimage/ring2/native/fp32/train", other),
            case("flux/ulysses2/native/fp32/tensor", "FAIL", reason="<b>see https://example.org/a?b=1&c=2</b>.")]


UNMATCHED = ["known_issues.toml #5 qwenimage@masked/*ulysses*", "known_issues.toml #7 ('ltx/*', 'ltx2/*')"]


@pytest.mark.parametrize(("query", "cases_", "entries"), [
    ("?q=QK-norm", ["flux/tp2/native/fp32/train", "flux/tp4/native/fp32/train"], ["issue-13"]),
    ("?q=qwenimage", ["qwenimage/ring2/native/fp32/train"], ["issue-5"]),
    ("?q=known_issues.toml%20%234", ["qwenimage/ring2/native/fp32/train"], ["issue-4"]),
    ("?q=ltx2/", [], ["issue-7"]),
    ("", [c["case_id"] for c in known_records()], ["issue-4", "issue-13", "issue-5", "issue-7"]),  # the control
])
def test_the_search_finds_a_case_id_or_a_known_issue(tmp_path, query, cases_, entries):
    """The search keeps the cases whose id or known-issue entry (title or key) holds the text, and the listed
    entries (met or unmatched, by key, title or globs) that hold it."""
    index = render_html(write(tmp_path / "run", known_records(), known_issues_unmatched=UNMATCHED))
    probe = ('window.__probe = function () { return Array.prototype.filter.call(document.querySelectorAll('
             '".issue-entry, .issue-unmatched"), window.__seen.shown).map(function (li) { return li.id; }); };')
    got = seen(tmp_path, index, query, OPEN_ALL + probe)
    assert {key for key, shown in got["cells"].items() if shown} == {anchor(c) for c in cases_}
    assert got["extra"] == entries


LINKS_SETUP = """var log = window.__log = {}, s = window.__seen;
setTimeout(function () {
  var group = document.querySelector("details.group"), key = group.querySelector("a.entry-key");
  key.click();
  setTimeout(function () {
    var entry = document.getElementById("issue-13"), b = entry.getBoundingClientRect();
    var hit = document.elementFromPoint(b.left + 4, b.top + b.height / 2);
    log.entry = [key.getAttribute("href"), s.inView(entry), entry.contains(hit), entry.textContent, window.scrollY];
  }, 40);
  log.upstream = Array.prototype.map.call(document.querySelectorAll("a.cause-link"), function (a) {
    return [a.textContent, a.getAttribute("href")]; });
  log.unmatched = Array.prototype.map.call(document.querySelectorAll(".issue-unmatched"), function (li) {
    return [li.id, s.shown(li), li.textContent]; });
  document.querySelector('a.case-link[href="#case-flux/ulysses2/native/fp32/tensor"]').click();
  var reason = document.querySelector("#opened pre.reason");
  log.reason = [reason.querySelectorAll("a.out-link").length, reason.querySelector("a").getAttribute("href"),
                reason.textContent];
  document.querySelector('a.cell-case[href="#case-flux/tp2/native/fp32/train"]').click();
  log.known = Array.prototype.map.call(document.querySelectorAll("#opened .known-entry a"), function (a) {
    return [a.textContent, a.getAttribute("href")]; });
}, 40);
window.__probe = function () { return window.__log; };
window.__wait = 1500;"""


def test_known_issues_link_their_listing_their_upstream_and_the_unmatched_entries(tmp_path):
    """An XFAIL group's `known_issues.toml #13` is a link to the page's listing of that entry, which comes into
    view clear of the filter bar; an entry's upstream thread is linked beside its traced cause; the entries that
    matched no case are listed; an address in a reason is a link, the markup around it text."""
    index = render_html(write(tmp_path / "run", known_records(), known_issues_unmatched=UNMATCHED))
    got = seen(tmp_path, index, "", OPEN_ALL + LINKS_SETUP)["extra"]
    href, in_view, on_top, text, scrolled = got["entry"]
    assert href == "#issue-13" and in_view and on_top and "(2 cases)" in text and scrolled > 0, got["entry"]
    upstream = "https://github.com/huggingface/diffusers/issues/12706"
    assert ["upstream \u2197", upstream] in got["upstream"]
    assert ["traced cause \u2197", KNOWN["link"]] in got["upstream"]
    assert [upstream in href for _, href in got["upstream"]].count(True) == 2  # the group and the listing; not #4
    assert got["unmatched"] == [["issue-5", True, "known_issues.toml #5 qwenimage@masked/*ulysses*"],
                                ["issue-7", True, "known_issues.toml #7 ltx/*, ltx2/*"]]
    assert got["reason"] == [1, "https://example.org/a?b=1&c=2", "<b>see https://example.org/a?b=1&c=2</b>."]
    assert ["upstream \u2197", upstream] in got["known"] and ["known_issues.toml #13", "#issue-13"] in got["known"]


def test_filtered_summaries_count_what_is_shown(tmp_path):
    """Under a filter a matrix section's summary counts the cases shown ("n of N"), and the note on all-SKIP rows
    left out counts only rows that hold a case the filters show (flux's two all-SKIP rows are bf16 tensor cases);
    unfiltered (the control) it counts every case and both rows."""
    records = browser_cases()
    probe = ('window.__probe = function () { var m = document.querySelector(\'details.section[data-section="flux"]\');'
             ' return [m.querySelector(".section-count").textContent, Array.prototype.filter.call(m.querySelectorAll('
             '".section-tally .badge"), window.__seen.shown).map(function (b) { return b.textContent; })]; };')
    index = run(tmp_path, records)
    flux = [c for c in records if c["model"] == "flux"]
    for query, keep in (("", lambda c: True), ("?kind=image", lambda c: c["kind"] == "image"),
                        ("?dtype=bf16", lambda c: c["dtype"] == "bf16")):
        got = seen(tmp_path, index, query, OPEN_ALL + probe)
        kept = [c for c in flux if keep(c)]
        total = f"{len(kept)} cases" if len(kept) == len(flux) else f"{len(kept)} of {len(flux)} cases"
        assert got["extra"][0] == total, (query, got["extra"])
        tally = {}
        for c in kept:
            tally[c["status"]] = tally.get(c["status"], 0) + 1
        every = {s: sum(c["status"] == s for c in flux) for s in tally}
        assert sorted(got["extra"][1]) == sorted(f"{n} {s}" if n == every[s] else f"{n} of {every[s]} {s}"
                                                 for s, n in tally.items()), (query, got["extra"])
        rows = 0 if query == "?kind=image" else 2
        assert got["skipNotes"][0].startswith(f"{rows} rows in which") if rows else got["skipNotes"][0] == ""


# Scrolls the page so that the matrix box's top sits `offset` px below the stuck filter bar's bottom (negative: under
# it), sends the scroll event a browser sends after scrolling (headless Chromium's virtual time draws no frames, so
# it sends none), and records the bar, the box, the header row's 6th cell and the corner cell.
STICKY_SETUP = OPEN_ALL + """var log = window.__log = [], offsets = [-30, -150, -320];
function measure(k) {
  var bar = document.getElementById("filters"), box = document.querySelector(".scroll");
  if (k >= offsets.length) { return; }
  window.scrollTo(0, window.scrollY + box.getBoundingClientRect().top - bar.offsetHeight - offsets[k]);
  window.dispatchEvent(new Event("scroll"));
  setTimeout(function () {
    var table = box.querySelector("table.matrix"), head = table.querySelector("thead th:nth-child(6)");
    var corner = table.querySelector("thead th"), control = bar.querySelector("select");
    function onTop(el) {
      var b = el.getBoundingClientRect();
      return el.contains(document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2));
    }
    log.push({bar: bar.getBoundingClientRect().bottom, box: box.getBoundingClientRect().top,
              head: head.getBoundingClientRect().top, corner: corner.getBoundingClientRect().top,
              headOnTop: onTop(head), cornerOnTop: onTop(corner), controlOnTop: onTop(control)});
    measure(k + 1);
  }, 40);
}
setTimeout(function () { measure(0); }, 30);
window.__probe = function () { return window.__log; };
window.__wait = 1500;"""


@pytest.mark.parametrize("held", [True, False])
def test_the_matrix_header_stays_below_the_filter_bar(tmp_path, held):
    """At several scroll positions past the matrix's top, its header row and corner cell sit just below the sticky
    filter bar, visible, and the bar's controls stay on top. The control (`held` False) pins the header row to the
    box's top as before: it slides under the bar."""
    unheld = ('var st = document.createElement("style"); st.textContent = ".matrix thead th { top: 0 !important; }";'
              " document.head.appendChild(st);")
    got = seen(tmp_path, run(tmp_path, wide_cases()), "", ("" if held else unheld) + STICKY_SETUP,
               window=(1000, 700))["extra"]
    assert len(got) == 3 and all(at["box"] < at["bar"] - 20 for at in got), got  # the box's top under the bar
    for at in got:
        assert at["controlOnTop"], at
        if held:
            assert at["head"] == pytest.approx(at["bar"], abs=1.5) and at["corner"] == pytest.approx(at["bar"], abs=1.5)
            assert at["headOnTop"] and at["cornerOnTop"], at
        else:
            assert at["head"] < at["bar"] - 20 and not at["headOnTop"], at


def test_the_first_screen_gives_the_verdict_the_setup_and_says_coverage_was_not_measured(tmp_path):
    """A laptop's first screen: the verdict in one word, the world sizes, the plan and whether coverage was measured;
    where the coverage section would be, the page says it was not measured. A run without failures (the control)
    says PASS."""
    probe = ('window.__probe = function () { var s = window.__seen, v = document.getElementById("verdict"),'
             ' line = document.getElementById("setup-line");'
             ' return [v.textContent, s.inView(v), line.textContent, s.inView(line),'
             ' document.getElementById("coverage").textContent]; };')
    failing = seen(tmp_path, run(tmp_path, settings={"plan": "quick"}, world_sizes=[2, 4]), "", probe,
                   window=(1280, 720))["extra"]
    assert failing[:2] == ["FAIL", True] and failing[3], failing
    assert failing[2] == "world sizes 2, 4 \u00b7 plan quick \u00b7 coverage not measured (run with --coverage)"
    assert "Not measured: this run did not use --coverage" in failing[4]
    passing = render_html(write(tmp_path / "passing", [case("flux/ring2/native/fp32/tensor", "PASS")]))
    assert seen(tmp_path, passing, "", probe)["extra"][0] == "PASS"
