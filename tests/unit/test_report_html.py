"""The HTML report shows results.json faithfully, escapes strings, loads nothing remote, stays small on a full plan,
and in a real browser shows the failing cases first, filters, and draws a case's detail when it is opened."""

from __future__ import annotations

import html as html_lib
import importlib.util
import json
import re
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from harness.core import figures
from harness.core.figures import FigureSpec
from harness.core.results import CaseResult, Status, read_results
from harness.report import changed_markdown, compare_runs, render_html
from harness.report.axes import axes, spell
from harness.report.data import anchor, link
from harness.report.detail import safe_relative
from harness.report.embed import SHOWN_CHECKS
from tests.report_pages import (
    EVIL,
    GRAD,
    HIST,
    IMAGES,
    KNOWN,
    OPEN_ALL,
    TRACEBACK,
    WORST,
    case,
    cases,
    chromium,
    embedded,
    image_block,
    known_xfail,
    picture,
    pictures,
    pixels,
    seen,
    shot,
    tensor,
    train_blocks,
    write,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def page(tmp_path) -> str:
    return render_html(write(tmp_path / "run", cases(), mismatch="references from diffusers 0.41.0")).read_text()


def decoded(page: str) -> list[dict]:
    """The embedded records read back the way the page script reads them (static/report.js `decode`, `full`,
    `extraOf`, `unpack`)."""
    data = embedded(page)

    def text(field, value):
        return data["s"][field][value] if isinstance(value, int) else ("" if value is None else value)

    def unpack(value):
        if isinstance(value, list):
            return [unpack(item) for item in value]
        if not isinstance(value, dict):
            return value
        refs = value.get("$", [])
        return {k: unpack(data["v"][v] if k in refs else v) for k, v in value.items() if k != "$"}

    out = []
    for row in data["c"]:
        c = dict(zip(data["fields"], row + [None] * (len(data["fields"]) - len(row)), strict=True))
        c = {name: text(name, value) if name in data["text"] else value for name, value in c.items()}
        c["case_id"] = c["case_id"] or spell(c)
        c["figures"] = [[*data["f"][f[0]][:2], *(text("figures", t) for t in f[1:])] for f in c["figures"] or []]
        c["evidence"] = [[text("evidence", t) for t in e[:6]] + e[6:] for e in c["evidence"] or []]
        c["known_issues"] = [data["v"][k] for k in c["known_issues"] or []]
        pairs = c["extra"] or []
        c["left"] = text("extra", pairs[-1]) if len(pairs) % 2 else ""
        c["extra"] = {text("extra", k): unpack(data["v"][v]) for k, v in zip(pairs[::2], pairs[1::2], strict=False)}
        out.append(c)
    return out


def test_records_are_embedded_once_and_read_back_whole(tmp_path, page):
    """Every case comes back from the page's JSON: its axes, id, status, reason, world size, cell text (computed
    by harness.core.figures.cell), each figure written in its own format with limit and ratio, each failed check,
    and its extra data (other data only for cases that need a look; image paths a page must not load dropped).
    Repeated strings (one traceback in three cases, one SKIP reason in two) are stored once."""
    _, loaded = read_results(tmp_path / "run/results.json")
    for got, want in zip(decoded(page), loaded, strict=True):
        assert {key: got[key] for key in ("case_id", "status", "reason", "world_size", "kernels")} == \
            {key: getattr(want, key) for key in ("case_id", "status", "reason", "world_size", "kernels")}
        assert all(got[a["name"]] == getattr(want, a["name"]) for a in axes())
        assert got["cell"] == want.cell
        assert [f[:3] for f in got["figures"]] == [[f["name"], f["label"], figures.written(f)] for f in
                                                     want.figures]
    fail, xfail, image = decoded(page)[1], decoded(page)[5], decoded(page)[8]
    assert fail["cell"] == "1.2e-02" and fail["figures"][0] == ["max_abs_err", "max abs err", "0.0123", "1e-05",
                                                                 "1230\u00d7"]
    assert fail["evidence"] == [["max_abs", "", "0.0123", "1e-05"]]
    assert xfail["cell"] == "nan" and xfail["figures"][0][2] == "nan"
    assert image["extra"]["images"] == {name: safe_relative(path) for name, path in IMAGES.items() if name != "diff"}
    assert image["extra"]["images"]["ssim_map"] == "images/ssim%20map.png"
    data = embedded(page)
    assert data["v"].count(TRACEBACK) == 1 and data["s"]["reason"].count("tp needs CUDA") == 1
    assert page.count("Traceback (most recent call last)") == 1


def test_only_ids_the_axes_cannot_spell_are_embedded(tmp_path):
    """An id the axes spell (harness.report.axes, from harness.core.records.case_id) is left out; a negative
    control's `model@shape/.../kind+fault` id is embedded and read back."""
    records = [case("flux@txt7/ring2/native/fp32/tensor", "PASS"), case("flux/ring2/native/fp32/tensor+hang", "FAIL")]
    data_page = render_html(write(tmp_path / "run", records)).read_text()
    rows = embedded(data_page)["c"]
    fields = embedded(data_page)["fields"]
    ids = [row[fields.index("case_id")] if len(row) > fields.index("case_id") else None for row in rows]
    assert ids == [None, "flux/ring2/native/fp32/tensor+hang"]
    assert [c["case_id"] for c in decoded(data_page)] == [r["case_id"] for r in records]


def test_other_data_only_for_cases_that_need_a_look(tmp_path):
    """A passing case's phases stay in results.json (the page names the key); a failing case's come along."""
    extra = {"phases": {"forward": 0.5}, "blocks": [figures.histogram("h", [0, 1], [3])]}
    records = [case("a/ring2/native/fp32/tensor", "PASS", extra=dict(extra)),
               case("a/ring4/native/fp32/tensor", "FAIL", extra=dict(extra))]
    passing, failing = decoded(render_html(write(tmp_path / "run", records)).read_text())
    assert "phases" not in passing["extra"] and passing["left"] == "phases" and "blocks" in passing["extra"]
    assert failing["extra"]["phases"] == {"forward": 0.5} and failing["left"] == ""


def test_many_failed_checks_are_cut_per_check(tmp_path):
    """A train case can fail a check on 150 parameters: the page keeps each check's worst SHOWN_CHECKS and counts
    the rest; a check with fewer keeps them all."""
    items = [{"check": "grad_rel", "text": "t", "subject": f"p{i}", "value": 1.0 - i / 100, "limit": 1e-4}
             for i in range(SHOWN_CHECKS + 5)] + [{"check": "loss_rel", "text": "loss", "value": 0.1, "limit": 1e-5}]
    got = decoded(render_html(write(tmp_path / "run", [case("a/ring4/native/fp32/train", "FAIL",
                                                           evidence=items)])).read_text())[0]["evidence"]
    assert [e[1] for e in got[:SHOWN_CHECKS]] == [f"p{i}" for i in range(SHOWN_CHECKS)]
    assert got[SHOWN_CHECKS][0] == "loss_rel" and got[-1] == ["grad_rel", "", "", "", "", "", 5]


def test_every_string_is_escaped(page):
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page  # the failing row's reason
    assert "\\u003cscript>alert" in page  # and in the embedded JSON, where "<" cannot close the element
    assert page.count("<script") == 2  # the records and the page's own script, nothing else


def _section(page: str, section_id: str) -> str:
    found = re.search(rf'<section id="{section_id}"[^>]*>(.*?)</section>', page, re.S)
    assert found, section_id
    return found.group(1)


def test_failing_cases_first_then_groups_by_reason(page):
    """FAIL, ERROR, TIMEOUT, XPASS (Status order) one row each with its cell text and the whole reason; XFAIL per
    known issue and SKIP per reason, each with its count and ids, no row per case until opened."""
    order = [page.index(f'<section id="{key}"') for key in ("failing", "details", "known-issues", "skipped",
                                                             "passing", "matrix", "environment")]
    assert order == sorted(order)
    failing = _section(page, "failing")
    assert "Needs a look (4: 1 FAIL, 1 ERROR, 1 TIMEOUT, 1 XPASS)" in failing
    rows = re.findall(r'<span class="badge s-(\w+)">.*?<code>(.*?)</code>.*?<td class="n">(.*?)</td>.*?'
                      r'<div class="reason-cell">(.*?)</div>', failing, re.S)
    assert [(status, case_id, cell) for status, case_id, cell, _ in rows] == [
        ("FAIL", "flux/ring2/native/fp32/tensor", "1.2e-02"), ("ERROR", "flux/ulysses4/flex/fp32/tensor", ""),
        ("TIMEOUT", "qwenimage/ulysses2/native/bf16/tensor", ""),
        ("XPASS", "qwenimage/ulysses4/native/fp32/tensor", "1.7e-07")]
    assert rows[0][3] == "max_abs_err 1.2e-2 &gt; 1e-5" and rows[3][3].startswith("known issue no longer reproduces")
    assert f'href="#{anchor("flux/ring2/native/fp32/tensor")}"' in failing
    xfail, skipped = _section(page, "known-issues"), _section(page, "skipped")
    assert "(2 cases, 1 issue)" in xfail and '<b class="n">2</b> <span class="severity sev-crash">crash</span> ' \
        '<span class="why">known issue: #12 &lt;ring&gt;</span>' in xfail
    assert "<li><code>qwenimage/{ring2,ring4}/native/bf16/tensor</code> (2)</li>" in xfail
    assert '<b class="n">2</b> <span class="why">tp needs CUDA</span>' in skipped
    assert "<li><code>flux/{tp2,tp4}/native/bf16/tensor</code> (2)</li>" in skipped
    for section in (xfail, skipped, _section(page, "passing")):
        assert "case-row" not in section and '<div class="rows"></div>' in section


def test_failing_sections_open_first(tmp_path, page):
    found = re.findall(r'<details class="section" data-section="(\w+)"( open)?>', page)
    assert found == [("flux", " open"), ("qwenimage", " open")]  # both have a failing case
    records = [case("a/ring2/native/fp32/tensor", "PASS"), case("b/ring2/native/fp32/tensor", "FAIL")]
    other = render_html(write(tmp_path / "other", records)).read_text()
    assert re.findall(r'<details class="section" data-section="(\w+)"( open)?>', other) == [("b", " open"), ("a", "")]


def test_filters_follow_the_axes(page):
    """A filter for the status and for every axis on which the cases differ (model, layout, backend, dtype, kind
    here; shape does not differ), in that order; statuses in Status order."""
    names = re.findall(r'<select name="(\w+)">', page)
    assert names == ["status", "model", "layout", "backend", "dtype", "kind"]
    statuses = re.search(r'<select name="status">(.*?)</select>', page).group(1)
    assert re.findall(r'<option value="(\w+)">', statuses) == ["PASS", "FAIL", "ERROR", "SKIP", "TIMEOUT", "XFAIL",
                                                                "XPASS"]


def _loads_nothing_remote(page: str) -> None:
    """Nothing the browser fetches (a src, a <link>, a CSS url or @import) is remote; a link out of the page (a known
    issue's traced cause) is an http(s) anchor opened in a new tab without a referrer, and nothing else is remote."""
    assert not re.search(r'\bsrc\s*=\s*"(?:https?:)?//', page) and not re.search(r"<link\b", page)
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//|@import", page)
    for tag in re.findall(r'<[^>]*\bhref\s*=\s*"(?:[a-z]+:)?//[^"]*"[^>]*>', page):
        assert re.match(r'<a class="(cause|out)-link" href="https?://', tag) and 'rel="noopener noreferrer"' in tag, \
            tag
    assert not re.search(r'href\s*=\s*"\s*javascript:', page, re.I)


def test_no_remote_resources(page):
    _loads_nothing_remote(page)
    assert "evil.example" not in page


def test_an_xfail_group_is_titled_by_its_entries_and_links_their_cause(tmp_path):
    """XFAIL cases are grouped by the known_issues.toml entries that excused them: the group says the entry's title,
    links its traced cause and names where it is listed, with the reason the entry gives in its body; an XFAIL no
    entry excused (an expected refusal) is grouped by its reason as before. A link that is not http(s) is no link."""
    evil = dict(KNOWN, key="known_issues.toml #2", title="scripted", link="javascript:alert(1)")
    records = [known_xfail(), known_xfail("flux/tp4/native/fp32/train"), known_xfail("qwenimage/tp2/native/fp32/train",
                                                                                      evil),
               case("flux/ring2/native/fp32/tensor", "XFAIL", reason="expected refusal: no lse; observed ERROR: x")]
    page_ = render_html(write(tmp_path / "run", records)).read_text()
    _loads_nothing_remote(page_)
    xfail = _section(page_, "known-issues")
    assert "(4 cases, 3 issues)" in xfail
    assert re.search(r'<b class="n">2</b> <span class="severity sev-silently-wrong">silently wrong</span> '
                     r'<span class="why">tensor parallelism: wrong &lt;QK-norm&gt; gradients'
                     rf'</span> <span class="entry"><a class="cause-link" href="{re.escape(KNOWN["link"])}" '
                     r'target="_blank" rel="noopener noreferrer">traced cause \u2197</a>  <a class="entry-key muted" '
                     r'href="#issue-13">known_issues.toml #13</a>', xfail), xfail
    assert ('<p class="cause">known issue: per-head norms act on sharded heads (<a class="out-link" '
            f'href="{KNOWN["link"]}" target="_blank" rel="noopener noreferrer">{KNOWN["link"]}</a>)') in xfail
    assert ('<span class="why">scripted</span> <span class="entry">  <a class="entry-key muted" href="#issue-2">'
            "known_issues.toml #2") in xfail
    # a refusal (here an XFAIL of a file from before REFUSED) is its own kind of finding, listed last
    groups = re.findall(r'<details class="group.*?</details>', xfail)
    assert ['sev-silently-wrong' in group for group in groups] == [True, True, False]
    assert '<span class="severity sev-refusal">refusal</span> <span class="why">expected refusal: no lse</span>' \
        '</summary>' in groups[-1]
    got = decoded(page_)
    assert got[0]["known_issues"] == [dict(KNOWN, anchor="issue-13", upstream="")]
    assert got[2]["known_issues"][0]["link"] == ""  # the page gets no such link
    assert [e[4:6] for e in got[0]["evidence"]] == [["known_issues.toml #13", "[0.3, 1.75]"]] * 2 + \
        [["known_issues.toml #13"]]  # the loss check's entry measured no band


def test_the_matrix_legend_names_each_cell_figure_from_the_data(tmp_path):
    """Under the matrix heading, each figure a cell writes: an example cell (a non-zero one where a case has it),
    the figure's label, the kinds whose cases write it, all from the records (a figure no kind declares is named as
    well); a run with no cell figure has no legend (the control)."""
    novel = FigureSpec("novel_err", "a <new> figure", cell="n{value:.1f}")
    records = [case("flux/single/native/fp32/tensor", "PASS", figures=tensor(0.0)),
               case("flux/ring2/native/fp32/tensor", "PASS", figures=tensor(1.7e-7)),
               case("flux/ring2/native/fp32/image", "PASS", figures=picture(0.99998, 70.0)),
               case("flux/ring2/native/fp32/train", "PASS", figures=[GRAD.of(3e-7, 1e-4), WORST.of("w")]),
               case("flux/ring2/native/fp32/novel", "PASS", figures=[novel.of(2.0)]),
               case("flux/ring4/native/fp32/tensor", "ERROR", figures=[])]
    page_ = render_html(write(tmp_path / "run", records)).read_text()
    legend = re.findall(r'<li data-figure="(\w+)"><code class="cell-example">(.*?)</code> <span class="cell-label">'
                        r'(.*?)</span> <span class="muted">\((.*?)\)</span></li>', page_)
    assert legend == [("max_abs_err", "1.7e-07", "max abs err", "tensor cases"),
                      ("ssim", "ssim 1.0000", "SSIM", "image cases"),
                      ("grad_err", "g3e-07", "gradient rel L2 err", "train cases"),
                      ("novel_err", "n2.0", "a &lt;new&gt; figure", "novel cases")]
    bare = render_html(write(tmp_path / "bare", [case("a/ring2/native/fp32/x", "PASS", figures=[WORST.of("w")])]))
    assert 'id="cell-legend"' not in bare.read_text()


def test_a_status_this_report_does_not_know_reads_as_an_error_that_says_so(tmp_path):
    """The page reads each case as the record it was written from; a status from elsewhere is not dropped (it would
    leave a hole in every count) but shown as ERROR, its reason saying what the file gave."""
    folder = tmp_path / "odd"
    folder.mkdir()
    record = case("a/ring2/native/fp32/tensor", "PASS", reason="was fine")
    (folder / "results.json").write_text(json.dumps({"header": {}, "cases": [dict(record, status="MAYBE")]}))
    header, (read,) = read_results(folder / "results.json")
    assert isinstance(read, CaseResult) and read.status is Status.ERROR and header.environment == {}
    assert read.reason == "results.json gives the status 'MAYBE', which this report does not know; was fine"


def test_header_environment_counts_and_purpose(tmp_path, page):
    assert 'role="alert"' in page and "references from diffusers 0.41.0" in page
    assert ('<p class="env-line" id="env-line"><b>torch</b> 2.13.0+cpu &middot; <b>diffusers</b> 0.42.1 &middot; '
            "<b>diffusers_commit</b> release wheel &middot; <b>python</b> 3.11.7 &middot; <b>device</b> cpu (x86_64) "
            '&middot; <a href="#environment">references: '
            "diffusers 0.41.0 (differs, see above)</a></p>") in page
    assert '<tr class="differs"><th scope="row">diffusers</th><td>0.42.1</td><td>0.41.0</td>' in page
    assert '<th scope="row">world sizes</th><td>2, 4</td>' in page
    for status, count in {"PASS": 2, "FAIL": 1, "ERROR": 1, "SKIP": 2, "XFAIL": 2, "TIMEOUT": 1, "XPASS": 1}.items():
        assert f'data-set-status="{status}" data-total="{count}" title="show only {status}"><b>{count}</b>' in page
    assert "FAIL is the expected outcome" not in page
    selftest = render_html(write(tmp_path / "selftest", cases()[:2], purpose="selftest")).read_text()
    assert '<div class="banner purpose" role="note">Selftest page:' in selftest
    assert "FAIL is the expected outcome" in selftest


def test_same_version_note_and_empty_run(tmp_path):
    same = render_html(write(tmp_path / "a", cases()[:1])).read_text()
    assert "same diffusers version (0.42.1)" in same and 'role="alert"' not in same
    assert "Nothing failed and no known issue stopped reproducing." in same
    empty = render_html(write(tmp_path / "b", [])).read_text()
    assert "No cases in this run." in empty


def test_helpers():
    assert anchor("flux@txt7/ring2/native/fp32/train+hang") == "case-flux@txt7/ring2/native/fp32/train+hang"
    assert link("reports/index.html", "a@b/c d/e") == "reports/index.html#case-a@b/c%20d/e"
    assert safe_relative("images/a b.png") == "images/a%20b.png"
    for bad in ("https://x/y.png", "//x/y.png", "/etc/passwd", "javascript:alert(1)", "C:/x.png"):
        assert safe_relative(bad) is None


def test_the_page_ships_its_scripts_and_stylesheet_as_package_data():
    """The JS and CSS are files of the package, declared as package data, so a wheel carries them, and inlined:
    the page loads nothing from beside itself."""
    static = resources.files("harness.report").joinpath("static")
    names = sorted(path.name for path in static.iterdir() if path.name.endswith((".js", ".css")))
    assert names == ["charts.js", "compare.js", "detail.js", "format.js", "matrix.js", "place.js", "report.css",
                     "report.js"]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = declared["harness.report"]
    assert all(any(Path("static", name).match(glob) for glob in globs) for name in names)
    assert not any(Path("static", "x.py").match(glob) for glob in globs)  # the control: the globs do not match all


def _bench():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "bench_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a full plan's worth of records, or every model captured
def test_full_plan_page_stays_small(tmp_path):
    """The synthetic full plan of benchmarks/bench_report.py (22,800 cases, ~17,000 SKIP, ~3,700 XFAIL, failed
    checks, blocks, tracebacks): index.html within 3 MB, no SKIP or XFAIL case with a row of its own in the HTML,
    and results.json holding each distinct traceback once."""
    bench = _bench()
    records = bench.synthetic_cases()
    folder = bench.write_run(tmp_path / "run", records)
    index = render_html(folder)
    assert len(records) == 22_800 and index.stat().st_size <= 3_000_000, index.stat().st_size
    page = index.read_text()
    rows = len(re.findall(r'<tr class="case-row" data-i="\d+">', page))
    assert rows == sum(c.status.needs_a_look for c in records)
    payload = json.loads((folder / "results.json").read_text())
    distinct = {c.extra["traceback"] for c in records if "traceback" in c.extra}
    uses = sum("traceback" in c.extra for c in records)
    assert len(payload["tracebacks"]) == len(distinct) < uses  # repeated ones share an entry
    assert all(isinstance(c["extra"].get("traceback", 0), int) for c in payload["cases"])


def test_compare_runs_writes_the_page(tmp_path):
    old_cases = cases()
    new_cases = [dict(c) for c in old_cases[:-2]]
    new_cases[0] = dict(new_cases[0], status="FAIL", reason="now <broken>")
    new_cases[1] = dict(new_cases[1], status="PASS", reason="")
    new_cases.append(case("flux2/ulysses2/native/fp32/tensor", "PASS"))
    new_cases.append(case("flux2/ring2/native/fp32/tensor", "ERROR", reason="new <case> fails"))
    old, new = write(tmp_path / "old", old_cases), write(tmp_path / "new", new_cases)
    comparison = compare_runs(old, new)
    assert comparison.page == new / "compare.html" and comparison.wrote == [new / "index.html", comparison.page]
    assert [c["case_id"] for c in comparison.changed] == ["flux/ulysses2/native/fp32/tensor",
                                                          "flux/ring2/native/fp32/tensor"]
    assert [c["case_id"] for c in comparison.only_new] == ["flux2/ulysses2/native/fp32/tensor",
                                                           "flux2/ring2/native/fp32/tensor"]
    assert [c["case_id"] for c in comparison.only_old] == ["qwenimage/ulysses2/native/fp32/image",
                                                           "qwenimage/ulysses4/native/fp32/tensor"]
    html = comparison.page.read_text()
    assert "now &lt;broken&gt;" in html and "<broken>" not in html and "new &lt;case&gt; fails" in html
    assert "2 changed status (1 regression), 2 only in NEW (1 failing), 2 only in OLD" in html
    assert 'href="index.html#case-flux/ulysses2/native/fp32/tensor"' in html
    assert "<h2>Only in OLD (2: 1 PASS, 1 XPASS)</h2>" in html
    assert "<li><code>qwenimage/ulysses2/native/fp32/image</code> (1)</li>" in html
    assert html.count("\u26a0 regression") == 2  # the broken case and the failing new one
    assert re.search(r'data-list="t-FAIL-PASS" data-kind="change"><summary><b class="n">1</b>', html)
    assert '<span class="why">every case only in NEW</span>' in html
    data = embedded(html, "compare-data")
    fixed = [[data["s"][k] for k in row] for row in data["lists"]["t-FAIL-PASS"]]
    assert fixed == [["flux/ring2/native/fp32/tensor", "FAIL", "PASS", "max_abs_err 1.2e-2 > 1e-5", ""]]
    markdown = changed_markdown(comparison)
    assert "| `flux/ulysses2/native/fp32/tensor` | PASS | FAIL \u26a0 | now <broken> |" in markdown
    assert "| `flux2/ring2/native/fp32/tensor` | ERROR \u26a0 | new <case> fails |" in markdown
    index_stamp = (new / "index.html").stat().st_mtime_ns
    other = compare_runs(old, new, out_dir=tmp_path / "out")
    assert other.wrote == [tmp_path / "out" / "compare.html"]  # NEW's index.html exists now: left alone
    assert 'href="../new/index.html' in other.page.read_text()
    assert (new / "index.html").stat().st_mtime_ns == index_stamp


@pytest.mark.slow  # a full plan's worth of records, or every model captured
def test_compare_of_full_plans_stays_small(tmp_path):
    """Thousands of changed cases (every SKIP of the full plan now PASS) are a count and patterns, not rows."""
    bench = _bench()
    old_cases = [c.to_dict() for c in bench.synthetic_cases()]
    new_cases = [dict(c, status="PASS", reason="") if c["status"] == "SKIP" else c for c in old_cases]
    comparison = compare_runs(write(tmp_path / "old", old_cases), write(tmp_path / "new", new_cases))
    html = comparison.page.read_text()
    skipped = sum(c["status"] == "SKIP" for c in old_cases)
    assert len(comparison.changed) == skipped > 15_000 and len(html) <= 1_500_000, len(html)
    assert html.count("<tr") < 20 and re.search(r'data-list="t-SKIP-PASS" data-kind="change"><summary>'
                                                 rf'<b class="n">{skipped}</b>', html)


def test_a_results_file_from_before_the_tracebacks_table_still_reads(tmp_path):
    """A results.json whose tracebacks are text in each case (older runs) reads as it is; one whose index points
    nowhere is refused with the file's name (the control: the index form is really resolved)."""
    folder = tmp_path / "old"
    folder.mkdir()
    record = case("a/ring2/native/fp32/tensor", "ERROR", extra={"traceback": TRACEBACK})
    (folder / "results.json").write_text(json.dumps({"header": {}, "cases": [record]}))
    assert read_results(folder / "results.json")[1][0].extra["traceback"] == TRACEBACK
    (folder / "results.json").write_text(json.dumps({"header": {}, "cases": [dict(record, extra={"traceback": 3})]}))
    from harness.core.errors import HarnessError

    with pytest.raises(HarnessError, match=r"results\.json is not whole .*traceback #3"):
        read_results(folder / "results.json")


def test_evil_reason_in_the_failing_list_is_text(page):
    assert EVIL not in page and "&lt;script&gt;" in _section(page, "failing")


# -- in a real browser --------------------------------------------------------------------------------------------

PASS_BG, FAIL_BG, XFAIL_BG = (0xDA, 0xFB, 0xE1), (0xFF, 0xEB, 0xE9), (0xFF, 0xF3, 0xB0)
CANDIDATE, REFERENCE = (255, 0, 255), (0, 200, 200)  # the test pictures' colours, to find them on screen
COLOURS = {"ref.png": REFERENCE, "cand.png": CANDIDATE, "diff.png": (0, 0, 0), "ssim map.png": (250, 250, 250)}


def browser_cases() -> list[dict]:
    """The fixture with an image FAIL first (so it is the case the page opens; its pictures in an images block with
    captions and scales), and a bf16 FAIL and PASS that sit crosswise to flux's fp32 ones (rows ring2 and ulysses2,
    columns fp32 and bf16): filtering to failures keeps both rows and both columns of flux's table, so the two PASS
    cells where they cross must disappear on their own."""
    image_fail = case("flux/ring4/native/fp32/image", "FAIL", figures=picture(0.7126, 21.3),
                      reason="vs fp32 reference: ssim 0.71260 < 0.9999", extra={"blocks": [image_block()]})
    return [image_fail, *cases(), case("flux/ulysses2/native/bf16/tensor", "FAIL", figures=tensor(0.2, 0.15),
                                       reason="too far"),
            case("flux/ring2/native/bf16/tensor", "PASS", figures=tensor(0.02, 0.15))]


def run(tmp_path: Path, records: list[dict] | None = None, **header) -> Path:
    folder = write(tmp_path / "run", browser_cases() if records is None else records, **header)
    pictures(folder, COLOURS)
    return render_html(folder)


@pytest.mark.slow
def test_browser_first_screen_shows_the_failures_and_an_opened_failure(tmp_path):
    """What a reviewer sees first, without scrolling or clicking: every failing (and XPASS) case with its reason,
    and the first failure opened with its four pictures, the difference and SSIM map each with the caption and
    scale its images block gives. No SKIP or XFAIL case is listed one by one."""
    index = run(tmp_path)
    got = seen(tmp_path, index)
    first = anchor("flux/ring4/native/fp32/image")
    assert got["ready"] == "1" and got["scripts"] == 3  # records, page script, probe: nothing injected
    assert [case_id for case_id, in_view, _ in got["failing"]] == [anchor(c) for c in (
        "flux/ring4/native/fp32/image", "flux/ring2/native/fp32/tensor", "flux/ulysses2/native/bf16/tensor",
        "flux/ulysses4/flex/fp32/tensor", "qwenimage/ulysses2/native/bf16/tensor",
        "qwenimage/ulysses4/native/fp32/tensor")]
    assert all(in_view for _, in_view, _ in got["failing"]), got["failing"]
    reasons = [reason for _, _, reason in got["failing"]]
    assert reasons[0] == "vs fp32 reference: ssim 0.71260 < 0.9999" and reasons[3] == EVIL  # text, not markup
    assert got["firstOpen"] == [first, True]
    images = {image["caption"]: image for image in got["images"]}
    assert list(images) == ["reference (fp32, single device)", "candidate", "difference \u00d710", "SSIM map"]
    assert all(image["loaded"] and image["inView"] for image in images.values()), images
    for caption, scale in (("difference \u00d710", "\u2265 0.1"), ("SSIM map", "clipped to [0, 1]")):
        assert "linear-gradient" in images[caption]["legend"], images[caption]
        assert scale in got["opened"]
    assert images["candidate"]["legend"] is None  # no scale given, none drawn
    statuses = {anchor(c["case_id"]): c["status"] for c in browser_cases()}
    assert not [key for key in got["rows"] if statuses[key] in ("SKIP", "XFAIL")]  # summarised, not listed
    picture_ = shot(tmp_path, index, "first")
    assert pixels(picture_, CANDIDATE) > 10_000 and pixels(picture_, REFERENCE) > 10_000  # both pictures on screen
    assert pixels(picture_, FAIL_BG) > 500


@pytest.mark.slow
@pytest.mark.parametrize(("query", "keep"), [
    ("?skips=1", lambda c: True),
    ("?status=FAIL&skips=1", lambda c: c["status"] == "FAIL"),
    ("?failures=1&skips=1", lambda c: c["status"] in ("FAIL", "ERROR", "TIMEOUT")),
    ("?failures=1&model=flux&skips=1", lambda c: c["status"] in ("FAIL", "ERROR", "TIMEOUT") and c["model"] == "flux"),
    ("?model=qwenimage&skips=1", lambda c: c["model"] == "qwenimage"),
    ("?kind=image&skips=1", lambda c: c["kind"] == "image"),
])
def test_browser_filters_hide_what_they_filter(tmp_path, query, keep):
    """Real chromium, every group and section opened: the query's filters leave on screen exactly the matching
    matrix cells and case rows, groups say how many of their cases match, empty groups and sections go, and the
    count buttons count what the other filters leave ("n of N" where that is fewer)."""
    records = browser_cases()
    index = run(tmp_path, records)
    got = seen(tmp_path, index, query, OPEN_ALL)
    expected = {anchor(c["case_id"]): keep(c) for c in records}
    assert got["cells"] == expected
    assert got["rows"] == expected  # every case has exactly one row: in the failing list or in its group
    assert got["details"] and all(expected[key] == shown for key, shown in got["details"].items())
    assert got["counter"] == f"Showing {sum(expected.values())} of {len(records)} cases"
    groups = embedded(index.read_text())["g"]
    for key, members in groups.items():
        kept = sum(keep(records[i]) for i in members)
        label = str(kept) if kept == len(members) else f"{kept} of {len(members)}"
        assert got["groups"][key] == ([True, label] if kept else [False, label]), key
    assert got["sections"] == {model: any(keep(c) for c in records if c["model"] == model)
                               for model in ("flux", "qwenimage")}
    status_free = re.sub(r"status=\w+&?", "", query)
    for status in ("PASS", "FAIL"):  # counted under every filter but the status one
        total = sum(c["status"] == status for c in records)
        left = sum(c["status"] == status and _keeps(status_free, c) for c in records)
        assert got["counts"][status] == f"{left}{status}" + ("" if left == total else f"of {total}"), got["counts"]


def _keeps(query: str, c: dict) -> bool:
    params = dict(part.split("=") for part in query.strip("?").split("&") if part)
    if params.get("failures") and c["status"] not in ("FAIL", "ERROR", "TIMEOUT"):
        return False
    return all(c[key] == value for key, value in params.items() if key not in ("failures", "skips"))


@pytest.mark.slow
def test_browser_leaves_out_all_skip_rows_unless_asked(tmp_path):
    """flux's tp2 and tp4 rows hold only SKIP cases: not drawn (with a note) until asked for."""
    index = run(tmp_path)
    skips = [anchor(c) for c in ("flux/tp2/native/bf16/tensor", "flux/tp4/native/bf16/tensor")]
    default, asked = seen(tmp_path, index, "", OPEN_ALL), seen(tmp_path, index, "?skips=1", OPEN_ALL)
    assert [default["cells"].get(key, False) for key in skips] == [False, False]
    assert [asked["cells"][key] for key in skips] == [True, True]
    assert default["skipNotes"][0].startswith("2 rows in which every case is SKIP or N/A left out")
    assert asked["skipNotes"][0] == ""
    assert sum(default["cells"].values()) == len(browser_cases()) - 2
    ticked = seen(tmp_path, index, "", OPEN_ALL + 'var s = document.querySelector("[name=skips]"); s.checked = true;'
                  ' s.dispatchEvent(new Event("change", {bubbles: true}));')
    assert [ticked["cells"][key] for key in skips] == [True, True]  # ticking the box draws them


@pytest.mark.slow
def test_browser_screenshot_shows_no_filtered_cell(tmp_path):
    """The pixels agree: with ?status=FAIL the matrix tables show FAIL's colour and none of PASS's or XFAIL's."""
    index, tall = run(tmp_path), (1280, 4000)  # tall enough to hold the page down to the first matrix
    box = seen(tmp_path, index, "?status=FAIL", window=tall)["matrix"]
    full_box = seen(tmp_path, index, "", window=tall)["matrix"]
    for area in (box, full_box):
        assert 0 <= area[0] < area[2] <= tall[0] and 0 <= area[1] < area[3] <= tall[1], area
    everything = shot(tmp_path, index, "all", window=tall)
    failures = shot(tmp_path, index, "fail", "?status=FAIL", window=tall)
    counts = {colour: pixels(everything, colour, full_box) for colour in (PASS_BG, FAIL_BG, XFAIL_BG)}
    assert min(counts.values()) > 200, counts  # unfiltered, the matrix shows all three colours
    filtered = {colour: pixels(failures, colour, box) for colour in (PASS_BG, FAIL_BG, XFAIL_BG)}
    assert filtered[FAIL_BG] > 200 and filtered[PASS_BG] == 0 and filtered[XFAIL_BG] == 0, filtered


@pytest.mark.slow
def test_browser_draws_details_when_opened(tmp_path):
    """Cases opened from a matrix cell get their whole detail: the figures against their limits (value / limit),
    the failed checks, kernels next to dispatched, whole tracebacks, the histogram with its limit line, other data
    as a readable list (not JSON), a thumbnail with its note."""
    kernels = "aten::_scaled_dot_product_flash_attention_for_cpu:4 aten::<odd>:2"
    frames = "".join(f'  File "/src/module_{i}.py", line {i}, in function_{i}\n    call_{i}(x)\n' for i in range(300))
    traceback = f"Traceback (most recent call last):\n{frames}RuntimeError: the end"
    observed = "ERROR: " + "long message " * 400 + "END"
    check = {"check": "max_abs", "text": "max abs err 0.0123 > 1e-05", "value": 0.0123, "limit": 1e-5,
             "known": "known_issues.toml #4"}
    records = [
        case("flux/ulysses2/_native_flash/fp32/tensor", "PASS", kernels=kernels, extra={"blocks": [HIST]}),
        case("flux/ulysses2/native/fp32/tensor", "XFAIL", figures=tensor(0.0123), evidence=[check], reason="known"),
        case("flux/ring2/native/fp32/tensor", "ERROR", reason="rank 1: RuntimeError: the end", figures=[],
             extra={"traceback": traceback, "observed": observed, "phases": {"forward": 0.25, "gathers": 0.5}}),
        case("flux/ring2/native/fp32/image", "PASS", figures=picture(0.99871, 48.2, 0.99),
             extra={"images": {"thumbnail": "images/cand.png"}}),
    ]
    ids = [anchor(c["case_id"]) for c in records]
    clicks = "".join(f'document.querySelector(\'a.cell-case[href="#{key}"]\').click();' for key in ids)
    probe = ('window.__probe = function () { return Array.prototype.map.call(document.querySelectorAll('
             '"#opened .other-data"), function (d) { return [d.closest("details").id, d.innerText, '
             'd.querySelectorAll("dt").length]; }); };')
    got = seen(tmp_path, run(tmp_path, records), "", OPEN_ALL + f"setTimeout(function () {{ {clicks} }}, 50);" + probe)
    assert set(got["details"]) == set(ids) and all(got["details"].values())

    def detail(key: str) -> str:
        return got["opened"].split(f'id="{key}"', 1)[1].split("</details>", 1)[0]

    figures_ = re.findall(r'<tr data-figure="(\w+)"[^>]*><td>([^<]*)</td><td[^>]*>([^<]*)</td><td class="n">([^<]*)'
                          r'</td><td class="n">([^<]*)</td>', detail(ids[1]))
    assert figures_ == [("max_abs_err", "max abs err", "0.0123", "1e-05", "1230\u00d7"),
                        ("mean_abs_err", "mean abs err", "2e-08", "", ""), ("nonfinite", "non-finite values", "0", "",
                                                                             "")]
    assert re.search(r'<tr data-check="max_abs"><td><code>max_abs</code></td><td>\u2014</td><td class="n">0.0123</td>'
                     r'<td class="n">1e-05</td><td class="n band"></td><td><span class="known-title" '
                     r'title="known_issues.toml #4">known_issues.toml #4</span></td></tr>', detail(ids[1]))
    assert "Failed checks" not in detail(ids[0])  # a case with none has no table of them
    assert re.search(r'<th scope="row">dispatched</th><td><code>_native_flash:2</code></td></tr>'
                     r'<tr><th scope="row">kernels</th><td><code class="kernels">'
                     r"aten::_scaled_dot_product_flash_attention_for_cpu:4 aten::&lt;odd&gt;:2</code></td>",
                     detail(ids[0]))
    assert '<svg class="hist"' in detail(ids[0]) and 'class="limit">limit</text>' in detail(ids[0])
    assert '<th scope="row">kernels</th><td><code>\u2014</code> <span class="muted">(none recorded)</span>' in \
        detail(ids[1])
    assert f'<pre class="traceback">{html_lib.escape(traceback, quote=False)}</pre>' in detail(ids[2])
    other = {key: (text, terms) for key, text, terms in got["extra"]}
    assert other[ids[2]][1] == 4 and "END" in other[ids[2]][0] and "{" not in other[ids[2]][0]  # observed, phases
    assert "forward\n0.25" in other[ids[2]][0].replace("\t", "\n")
    assert "0.9987" in detail(ids[3]) and "Only a thumbnail is kept" in detail(ids[3])
    assert [image["caption"] for image in got["images"]] == ["thumbnail"]
    assert got["images"][0]["loaded"] and got["images"][0]["src"] == "images/cand.png"


DEATH_PROBE = """window.__probe = function () {
  var seen = window.__seen, out = {cells: {}, deaths: {}};
  document.querySelectorAll("a.cell-case").forEach(function (a) {
    var mark = a.querySelector(".rank-died");
    out.cells[a.getAttribute("href").slice(1)] = mark && seen.shown(mark) ? [mark.innerText, mark.title] : null;
  });
  document.querySelectorAll("#opened details.case").forEach(function (d) {
    var said = d.querySelector(".rank-death"), stack = said && said.nextElementSibling;
    out.deaths[d.id] = said && seen.shown(said) && seen.shown(stack) ? [said.innerText, stack.innerText] : null;
  });
  return out;
};"""


@pytest.mark.slow
def test_browser_marks_a_case_whose_rank_died_in_an_earlier_attempt(tmp_path):
    """A case that passed on its rerun after a rank's native death (harness.run.launch): its cell is marked, and
    opened it shows that death with the dead rank's stack; a case without one has neither."""
    error = "rank 1 died during the case (pid 4242): Aborted in _abort_self (reliability.py:54)"
    stack = 'Fatal Python error: Aborted\n\nCurrent thread 0x7f (most recent call first):\n  File "x.py", line 1'
    died = case("flux/ulysses2/native/fp32/tensor", "PASS", rank_death={"error": error, "traceback": stack},
                reason=f"PASS on its rerun in a fresh group; in its first attempt {error}")
    records = [died, case("flux/tp2/native/fp32/tensor", "PASS")]
    ids = [anchor(c["case_id"]) for c in records]
    clicks = "".join(f'document.querySelector(\'a.cell-case[href="#{key}"]\').click();' for key in ids)
    got = seen(tmp_path, run(tmp_path, records), "", OPEN_ALL + f"setTimeout(function () {{ {clicks} }}, 50);" +
               DEATH_PROBE)["extra"]
    assert got["cells"][ids[0]][0] == "\u2020" and "a rank died in an earlier attempt" in got["cells"][ids[0]][1]
    assert got["cells"][ids[1]] is None
    assert got["deaths"][ids[0]] == [error, stack], got["deaths"]
    assert got["deaths"][ids[1]] is None


@pytest.mark.slow
@pytest.mark.parametrize("fragment", [
    "#case-qwenimage@masked/ring2/native/bf16/train+hang",  # the raw id, `@` and `+` as they are
    "#case-qwenimage%40masked%2Fring2%2Fnative%2Fbf16%2Ftrain%2Bhang",  # percent-encoded
    "#qwenimage@masked/ring2/native/bf16/train+hang",  # the bare id
    "#case-qwenimage-masked-ring2-native-bf16-train-hang",  # the slug earlier pages used
])
def test_browser_opens_the_case_a_link_names(tmp_path, fragment):
    """index.html#case-<id> opens that case, in view, and keeps the filters that hide it in the lists; so do its
    encoded and bare forms and the slug of earlier pages."""
    wanted = "qwenimage@masked/ring2/native/bf16/train+hang"  # an XFAIL: in a closed group, not in the HTML
    records = [*browser_cases(), case(wanted, "XFAIL", reason="known issue: #12 <ring>; observed FAIL: 12 non-finite")]
    got = seen(tmp_path, run(tmp_path, records), f"?status=PASS{fragment}")
    assert got["firstOpen"] == [anchor(wanted), True]
    passing = sum(record["status"] == "PASS" for record in records)
    assert got["counter"] == f"Showing {passing} of {len(records)} cases"
    assert "known issue: #12 &lt;ring&gt;; observed FAIL: 12 non-finite" in got["opened"]


@pytest.mark.slow
def test_browser_an_unknown_fragment_opens_the_first_failure(tmp_path):
    """The control for the test above: a fragment that names no case opens what a plain load opens."""
    got = seen(tmp_path, run(tmp_path), "#case-nothing/like/this")
    assert got["firstOpen"] == [anchor("flux/ring4/native/fp32/image"), True]


@pytest.mark.slow
def test_browser_the_terminal_link_opens_its_case(tmp_path, monkeypatch):
    """`harness run` prints, under each failing case, the page link that opens it (the report folder as given,
    here `run/`); that link, followed, opens that case (and every line stays within 120 columns)."""
    from harness.core.results import CaseResult
    from harness.report import matrix

    records = browser_cases()
    index = run(tmp_path, records)
    monkeypatch.chdir(tmp_path)
    text = matrix.terminal([CaseResult.from_dict(r) for r in records], page="run/index.html")
    assert max(map(len, text.splitlines())) <= 120
    links = [line.strip() for line in text.splitlines() if "#case-" in line]
    assert len(links) == sum(Status(r["status"]).needs_a_look for r in records)
    wanted = "flux/ulysses4/flex/fp32/tensor"  # an ERROR, not the case a plain load opens
    (line,) = [line for line in links if line.endswith(wanted)]
    assert line == f"run/index.html#case-{wanted}" and (tmp_path / line.split("#")[0]) == index
    got = seen(tmp_path, index, line[len("run/index.html"):])
    assert got["firstOpen"] == [anchor(wanted), True]


@pytest.mark.slow
def test_browser_compare_draws_rows_when_opened(tmp_path):
    """compare.html's groups hold no rows in the HTML; opened in a browser, they list their cases, each linked to
    NEW's index.html by its raw id."""
    old_cases = cases()
    new_cases = [dict(c, status="PASS", reason="") if c["status"] == "SKIP" else c for c in old_cases]
    new_cases.append(case("flux2/ring2/native/fp32/tensor", "ERROR", reason="new <case> fails"))
    comparison = compare_runs(write(tmp_path / "old", old_cases), write(tmp_path / "new", new_cases))
    opener = ('<script>setTimeout(function () { document.querySelectorAll("details").forEach(function (d) '
              "{ d.open = true; }); }, 0);</script>")
    probed = comparison.page.with_name("probed.html")
    probed.write_text(comparison.page.read_text().replace("</body>", opener + "</body>"))
    dom = chromium(tmp_path, "--dump-dom", probed.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for case_id in ("flux/tp2/native/bf16/tensor", "flux/tp4/native/bf16/tensor"):  # SKIP -> PASS, drawn on opening
        assert re.search(rf'<a href="index.html#case-{re.escape(case_id)}"><code>{re.escape(case_id)}</code></a></td>'
                         r'<td><span class="badge s-SKIP">SKIP</span></td><td><span class="badge s-PASS">PASS</span>',
                         dom.stdout)
        assert comparison.page.read_text().count(case_id) == 1  # in the embedded list only
    assert "new &lt;case&gt; fails" in dom.stdout and "<case>" not in dom.stdout


SERIES_PROBE = """window.__probe = function () {
  var charts = document.querySelectorAll("#opened svg.series:not(.key)");
  function box(el) { var b = el.getBoundingClientRect(); return [b.left, b.right]; }
  var cells = Array.prototype.map.call(document.querySelectorAll("#opened table.block tbody tr"), function (tr) {
    return [box(tr.cells[0].querySelector("code")), box(tr.cells[1]), tr.cells[0].querySelector("code").textContent];
  });
  return {charts: charts.length, lines: Array.prototype.map.call(charts[0].querySelectorAll("g"), function (g) {
      var mark = g.querySelector(".mark");
      return [g.getAttribute("class"), mark.tagName, getComputedStyle(g.querySelector("polyline")).stroke,
              getComputedStyle(mark).fill, getComputedStyle(g.querySelector("polyline")).strokeDasharray];
    }), legend: Array.prototype.map.call(document.querySelectorAll("#opened .series-legend li"), function (li) {
      return li.textContent; }),
    labels: Array.prototype.map.call(document.querySelectorAll("#opened svg.series text.y-label"), function (t) {
      return t.textContent; }), diffs: charts.length > 1 ? charts[1].querySelectorAll("polyline").length : 0,
    cells: cells};
};"""


@pytest.mark.slow
def test_browser_draws_a_series_apart_and_a_table_in_its_columns(tmp_path):
    """A train FAIL's loss per step: three lines, each with its own colour, dash and marker shape, the reference's
    hollow so the layout's line shows through it; a line equal to the reference says "identical" in the legend (the
    one that differs does not); a second chart draws each line minus the reference; the y labels of a chart are
    written alike. The gradient table keeps each parameter name inside its own column, clear of the next."""
    reference = [2.2404088973999023, 2.147700548171997, 1.7290364503860474]
    blocks = train_blocks([2.2404088973999023, 2.147700548171997, 1.7297006845474243], reference, list(reference))
    train = case("flux/ring4/_native_flash/bf16/train", "FAIL", reason="gradient of blocks.0.attn.to_k.bias (1.02)",
                 figures=[GRAD.of(2.4e-2, 1e-4), WORST.of("blocks.0.attn.to_k.bias")], extra={"blocks": blocks})
    got = seen(tmp_path, render_html(write(tmp_path / "run", [train])), "", SERIES_PROBE)["extra"]
    assert got["charts"] == 2 and got["diffs"] == 2  # the lines, then the two lines' differences to the reference
    classes, marks, strokes, fills, dashes = zip(*got["lines"], strict=True)
    assert len(set(marks)) == 3 and len(set(strokes)) == 3 and len(set(dashes)) == 3, got["lines"]
    assert fills[list(classes).index("s0")] == "none"  # the reference's marker is a ring
    assert got["legend"][2].endswith("(identical to reference (fp32, one device))")
    assert "identical" not in got["legend"][1]  # the control: the layout's line differs (its last step)
    top, bottom = got["labels"][1], got["labels"][0]
    assert top.split(".")[-1].__len__() == bottom.split(".")[-1].__len__() and top != bottom, got["labels"]
    for name_box, next_box, name in got["cells"]:
        assert name_box[1] <= next_box[0], (name, name_box, next_box)  # the name ends before the next column starts


@pytest.mark.slow
def test_browser_the_overlap_check_sees_an_overlap(tmp_path):
    """The control for the column check above: a table whose name cell is forced narrow without wrapping does show
    its name running into the next column, and the check says so."""
    reference = [2.24, 2.14, 1.72]
    train = case("flux/ring4/_native_flash/bf16/train", "FAIL", reason="r",
                 extra={"blocks": train_blocks(reference, reference, reference)})
    squeeze = ('var st = document.createElement("style"); st.textContent = "table.grid td code { white-space: nowrap; '
               'word-break: normal; overflow-wrap: normal } table.block td:first-child { max-width: 40px; '
               'padding: 0 } table.block { table-layout: fixed; width: 400px }"; document.head.appendChild(st);')
    got = seen(tmp_path, render_html(write(tmp_path / "run", [train])), "", squeeze + SERIES_PROBE)["extra"]
    assert any(name_box[1] > next_box[0] for name_box, next_box, _ in got["cells"]), got["cells"]


CLIP_PROBE = """window.__probe = function () {
  function clip(el) { return [el.scrollHeight, el.clientHeight, parseFloat(getComputedStyle(el).lineHeight)]; }
  return {failing: clip(document.querySelector("#failing .reason-cell")),
          group: clip(document.querySelector("#known-issues .rows .reason-cell"))};
};"""


@pytest.mark.slow
def test_browser_needs_a_look_shows_each_reason_whole(tmp_path):
    """A reason of many lines is shown whole in Needs a look (nothing scrolled out of its box); the same reason in
    an opened group's row is cut to 3 lines there (the control: the measurement does see a cut)."""
    long = "; ".join(f"gradient of transformer_blocks.{i}.attn.to_k.weight (rel L2 err) 0.9 > 0.0001"
                     for i in range(12))
    records = [case("a/ring4/native/fp32/train", "FAIL", reason=long),
               case("a/ring2/native/fp32/train", "XFAIL", reason=f"known issue: x; observed {long}"),
               case("a/ring2/native/bf16/train", "XFAIL", reason=f"known issue: x; observed {long}")]
    got = seen(tmp_path, render_html(write(tmp_path / "run", records)), "",
               'document.querySelector("#known-issues details.group").open = true;' + CLIP_PROBE)["extra"]
    scroll, client, line = got["failing"]
    assert scroll <= client + 1 and client > 4 * line, got  # whole, and more than 3 lines tall
    scroll, client, line = got["group"]
    assert scroll > client + line and client <= 3 * line + 1, got


@pytest.mark.slow
def test_browser_a_selftest_page_says_fail_is_expected(tmp_path):
    """header["purpose"] = "selftest" (harness selftest's page) puts a banner on the first screen saying that FAIL is
    the expected outcome there; a run's page has none."""
    probe = ('window.__probe = function () { var b = document.querySelector(".banner.purpose");'
             ' if (!b) { return null; } var box = b.getBoundingClientRect();'
             ' return [getComputedStyle(b).display, box.top >= 0 && box.bottom <= innerHeight && box.height > 0,'
             ' b.textContent]; };')
    selftest = seen(tmp_path, run(tmp_path, purpose="selftest"), "", probe)["extra"]
    assert selftest[0] != "none" and selftest[1] and "FAIL is the expected outcome" in selftest[2]
    assert seen(tmp_path, run(tmp_path / "plain"), "", probe)["extra"] is None


@pytest.mark.slow
def test_browser_an_opened_fail_shows_how_to_reproduce_it_alone(tmp_path):
    """A FAIL that `harness repro` scripts (verdict.note_repro puts the command in extra.repro) shows the command in
    its opened detail, on screen and not as "other data"; a FAIL without one shows no such line."""
    wanted = "flux/tp2/native/fp32/tensor"
    records = [*browser_cases(), case(wanted, "FAIL", figures=tensor(9.9e-3), reason="max abs err 0.0099 > 1e-05",
                                      extra={"repro": f"harness repro {wanted}"})]
    probe = ('window.__probe = function () { return Array.prototype.map.call(document.querySelectorAll(".repro"),'
             ' function (p) { var box = p.getBoundingClientRect(); return [getComputedStyle(p).display,'
             ' box.height > 0, p.textContent]; }); };')
    shown = seen(tmp_path, run(tmp_path, records), f"#case-{wanted}", probe)
    assert shown["firstOpen"] == [anchor(wanted), True]
    assert len(shown["extra"]) == 1 and shown["extra"][0][0] != "none" and shown["extra"][0][1], shown["opened"]
    assert f"harness repro {wanted}" in shown["extra"][0][2]
    assert "Other data" not in shown["opened"] or "repro" not in shown["opened"].split("Other data")[-1]
    assert seen(tmp_path / "first", run(tmp_path / "first"), "", probe)["extra"] == []  # the image FAIL: none


KNOWN_PROBE = """window.__probe = function () {
  var s = window.__seen, d = document.querySelector("#opened details.case[open]");
  var entry = d.querySelector("ul.known li"), link = entry.querySelector("a.cause-link");
  var group = document.querySelector("#known-issues details.group > summary");
  return {entry: [entry.querySelector(".known-title").textContent, s.inView(entry)],
          link: [link.getAttribute("href"), link.target, link.rel, s.inView(link), getComputedStyle(link).display],
          group: [group.querySelector(".why").textContent, s.shown(group.querySelector("a.cause-link"))],
          rows: Array.prototype.map.call(d.querySelectorAll("table.evidence tbody tr"), function (tr) {
            return [tr.cells[0].textContent, tr.cells[2].textContent, tr.cells[4].textContent, tr.cells[5].textContent,
                    s.inView(tr.cells[4]) && s.inView(tr.cells[5])];
          })};
};"""


@pytest.mark.slow
def test_browser_an_xfail_names_its_known_issue_links_its_cause_and_shows_each_band(tmp_path):
    """An opened XFAIL shows, on screen, the title of the entry that excused it with a link to its traced cause (a new
    tab, no referrer), and in each failed check's row the band its figure sat in (the figure inside it) and the
    entry by title, not by its place in the file; the group it is listed in shows the same title and link."""
    wanted = "flux/tp2/native/fp32/train"
    got = seen(tmp_path, run(tmp_path, [known_xfail(wanted)]), f"#case-{wanted}", KNOWN_PROBE)
    assert got["firstOpen"] == [anchor(wanted), True]
    probe = got["extra"]
    assert probe["entry"] == [KNOWN["title"], True]
    assert probe["link"] == [KNOWN["link"], "_blank", "noopener noreferrer", True, "inline"]
    assert probe["group"] == [KNOWN["title"], True]
    assert [row[:4] for row in probe["rows"]] == [["grad_rel", "0.97", "[0.3, 1.75]", KNOWN["title"]],
                                                  ["grad_rel", "0.72", "[0.3, 1.75]", KNOWN["title"]],
                                                  ["loss_rel", "0.0003", "", KNOWN["title"]]]
    assert all(row[4] for row in probe["rows"]), probe["rows"]
    for _, value, band, _, _ in probe["rows"][:2]:
        low, high = json.loads(band)
        assert low <= float(value) <= high
    assert "known_issues.toml #13" not in "".join(row[3] for row in probe["rows"])  # named, not numbered


@pytest.mark.slow
def test_browser_the_first_screen_names_torch_diffusers_and_the_device(tmp_path):
    """What ran is read without scrolling, on a laptop's first screen: torch, diffusers, python and the device, and
    whether the references came from the same diffusers; the full Environment table stays at the end (the control:
    it is not on the first screen, so "in view" means something here)."""
    probe = ('window.__probe = function () { var s = window.__seen, line = document.getElementById("env-line");'
             ' return [s.inView(line), line.textContent, s.inView(document.querySelector("#environment table"))]; };')
    in_view, text, table_in_view = seen(tmp_path, run(tmp_path), "", probe, window=(1280, 720))["extra"]
    assert in_view and not table_in_view
    assert text == ("torch 2.13.0+cpu \u00b7 diffusers 0.42.1 \u00b7 diffusers_commit release wheel \u00b7 "
                    "python 3.11.7 \u00b7 device cpu (x86_64) \u00b7 references: diffusers 0.42.1 (the same)")


@pytest.mark.slow
def test_browser_a_passing_image_case_shows_reference_candidate_and_difference(tmp_path):
    """A PASS image case, its pictures pruned as `harness run` prunes them, shows the reference, the candidate and
    the difference side by side with the note that says they are previews; the pictures are put in the document
    (and so fetched) only when the case is opened."""
    from harness.report.images import NOTE, prune_images

    folder = tmp_path / "run"
    pictures(folder, {"ref.png": REFERENCE, "cand.png": CANDIDATE, "diff.png": (255, 255, 0)})
    wanted = "flux/ring2/native/fp32/image"
    result = CaseResult.from_dict(case(wanted, "PASS", figures=picture(0.99998, 70.0, 0.9999), extra={"images": {
        "reference": "images/ref.png", "candidate": "images/cand.png", "diff": "images/diff.png"}}))
    prune_images(result, folder / "images")
    index = render_html(write(folder, [result.to_dict()]))
    assert seen(tmp_path, index)["pictures"] == []  # nothing opened: no picture in the document
    got = seen(tmp_path, index, f"#case-{wanted}")
    assert [(image["caption"], image["loaded"], image["inView"]) for image in got["images"]] == [
        ("reference", True, True), ("candidate", True, True), ("diff", True, True)]
    shrunk = NOTE.format(size="Shrunk from 64 \u00d7 64 to 32 \u00d7 32 pixels (each side divided by 2)")
    assert len(got["pictures"]) == 3 and got["imageNotes"] == [shrunk]
    picture_ = shot(tmp_path, index, "preview", f"#case-{wanted}")
    for colour in (REFERENCE, CANDIDATE, (255, 255, 0)):
        assert pixels(picture_, colour) > 10_000, colour  # each drawn large enough to see (224 px across)


def wide_cases() -> list[dict]:
    """One model's matrix of 20 rows (layouts x backends) and 18 columns (shapes x kinds x dtypes): wider and taller
    than a 1000 x 700 window, as qwenimage's is on the full plan."""
    kinds = {"tensor": tensor(1.7e-7), "image": picture(0.99998, 70.0), "train": [GRAD.of(3e-7, 1e-4)]}
    return [case(f"qwenimage{'' if shape == 'default' else '@' + shape}/{layout}/{backend}/{dtype}/{kind}", "PASS",
                 figures=figures_)
            for layout in [f"{name}{n}" for name in ("ulysses", "ring") for n in range(2, 7)]
            for backend in ("native", "_native_flash") for shape in ("default", "masked", "txt7")
            for kind, figures_ in kinds.items() for dtype in ("fp32", "bf16")]


# Opens the matrix, scrolls the page until its box sits just below the sticky filter bar, notes where a body cell
# is, then scrolls the box right and down; the probe reads where the header row, the first column and that cell are.
STICKY_SETUP = """document.querySelectorAll("details.section").forEach(function (d) { d.open = true; });
setTimeout(function () {
  var box = document.querySelector(".scroll"), cell = box.querySelectorAll("tbody tr")[12].cells[6];
  window.scrollBy(0, box.getBoundingClientRect().top - document.getElementById("filters").offsetHeight - 12);
  window.__before = window.__seen.box(cell);
  box.scrollLeft = 500; box.scrollTop = 300;
}, 100);
window.__probe = function () {
  var box = document.querySelector(".scroll"), table = box.querySelector("table.matrix"), s = window.__seen;
  var head = table.querySelector("thead th:nth-child(6)"), row = table.querySelectorAll("tbody th")[12];
  var corner = table.querySelector("thead th"), cell = table.querySelectorAll("tbody tr")[12].cells[6];
  function onTop(el) {
    var b = el.getBoundingClientRect();
    return el.contains(document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2));
  }
  function held(el) { return [s.box(el), getComputedStyle(el).position, onTop(el)]; }
  var inner = s.box(box);
  return {inner: [inner[0] + box.clientLeft, inner[1] + box.clientTop], scrolled: [box.scrollLeft, box.scrollTop],
          head: held(head), row: held(row), corner: held(corner), before: window.__before, cell: s.box(cell),
          legend: Array.prototype.map.call(document.querySelectorAll("#cell-legend li"), function (li) {
            return [li.textContent, s.shown(li)]; })};
};"""


@pytest.mark.slow
@pytest.mark.parametrize("held", [True, False])
def test_browser_a_wide_matrix_holds_its_header_row_and_first_column(tmp_path, held):
    """Scrolled right and down inside its box, a matrix wider and taller than the window keeps its header row at
    the box's top and its first column at the box's left, each on top of the cells that pass under it, while a body
    cell moves by the scroll. The control (`held` False) takes the stickiness away and sees both leave."""
    unstick = ('var st = document.createElement("style"); st.textContent = ".matrix th { position: static '
               '!important; }"; document.head.appendChild(st);')
    got = seen(tmp_path, run(tmp_path, wide_cases()), "", ("" if held else unstick) + STICKY_SETUP,
               window=(1000, 700))["extra"]
    left, top = got["inner"]
    assert got["scrolled"] == [500, 300], got
    assert got["cell"][0] == pytest.approx(got["before"][0] - 500, abs=1)  # the cells did scroll
    assert got["cell"][1] == pytest.approx(got["before"][1] - 300, abs=1)
    head, row, corner = got["head"], got["row"], got["corner"]
    if not held:
        assert head[0][1] < top - 100 and row[0][0] < left - 100 and not head[2] and not row[2], got
        return
    assert head[1] == row[1] == corner[1] == "sticky"
    assert head[0][1] == pytest.approx(top, abs=1) and corner[0][:2] == pytest.approx([left, top], abs=1), got
    assert row[0][0] == pytest.approx(left, abs=1) and head[2] and row[2] and corner[2], got
    assert [text for text, shown in got["legend"] if shown] == ["1.7e-07 max abs err (tensor cases)",
                                                                "ssim 1.0000 SSIM (image cases)",
                                                                "g3e-07 gradient rel L2 err (train cases)"]


def test_unmatched_known_issues_are_listed_in_matrix_md_and_on_the_page(tmp_path):
    """As pytest lists unused xfails: the entries results.json names as matching no case, in matrix.md and in the
    page's listing (anchored by entry number, globs written as a list); a run with none says so on the page and
    adds nothing to matrix.md (the control)."""
    from harness.core.header import RunHeader
    from harness.report.write import write_reports

    unmatched = ["known_issues.toml #5 qwenimage@masked/*ulysses*", "known_issues.toml #7 ('ltx/*', 'ltx2/*')"]
    records = [CaseResult.from_dict(r) for r in cases()[:2]]
    write_reports(tmp_path / "a", records, RunHeader.from_dict({"known_issues_unmatched": unmatched}))
    markdown = (tmp_path / "a" / "matrix.md").read_text()
    assert "### Known-issue entries that matched no case (2)" in markdown
    assert "| known_issues.toml #5 | `qwenimage@masked/*ulysses*` |" in markdown
    assert "| known_issues.toml #7 | `ltx/*, ltx2/*` |" in markdown
    page_ = (tmp_path / "a" / "index.html").read_text()
    assert ('<li id="issue-7" class="issue-unmatched"><b>known_issues.toml #7</b> <code>ltx/*, ltx2/*</code></li>'
            in page_)
    write_reports(tmp_path / "b", records, RunHeader.from_dict({}))
    assert "matched no case" not in (tmp_path / "b" / "matrix.md").read_text()
    assert "Every entry of this release matched a case of this run." in (tmp_path / "b" / "index.html").read_text()


@pytest.mark.parametrize(("text", "expected"), [
    ("see (https://github.com/a/b/issues/1); then", 'see (<a class="out-link" href="https://github.com/a/b/issues/1" '
     'target="_blank" rel="noopener noreferrer">https://github.com/a/b/issues/1</a>); then'),
    ('<b>https://x.org/a?b=1&c="2"</b>.', '&lt;b&gt;<a class="out-link" href="https://x.org/a?b=1&amp;c=" '
     'target="_blank" rel="noopener noreferrer">https://x.org/a?b=1&amp;c=</a>&quot;2&quot;&lt;/b&gt;.'),
    ("javascript:alert(1) and ftp://x", "javascript:alert(1) and ftp://x"),  # not http(s): text
])
def test_addresses_in_a_reason_become_links_and_the_rest_stays_text(text, expected):
    from harness.report.detail import linked

    assert linked(text) == expected


def test_not_applicable_is_its_own_state_on_the_page(tmp_path):
    """An N/A case has its own count, colour and section, apart from the SKIP cases (and not counted with them)."""
    records = [case("flux/ulysses2/native/fp32/tensor", "PASS"),
               case("flux/ulysses2/_native_math/fp32/tensor", "N/A", figures=[],
                    reason="diffusers does not register backend '_native_math' as context-parallel capable"),
               case("flux/tp2/_native_cudnn/fp32/tensor", "SKIP", figures=[], reason="needs CUDA")]
    page = render_html(write(tmp_path, records)).read_text()
    for status in ("N/A", "SKIP"):
        assert f'data-set-status="{status}" data-total="1" title="show only {status}"><b>1</b>{status}' in page
    not_applicable = page.split('<section id="not-applicable">', 1)[1].split("</section>", 1)[0]
    skipped = page.split('<section id="skipped">', 1)[1].split("</section>", 1)[0]
    assert 'class="group s-N/A"' in not_applicable and "context-parallel capable" in not_applicable
    assert "needs CUDA" in skipped and "context-parallel capable" not in skipped
    assert ".s-N\\/A {" in page  # the stylesheet gives it a colour of its own
    assert '<option value="N/A">' in page.split('<select name="status">', 1)[1].split("</select>", 1)[0]


def flow_cases() -> list[dict]:
    """flux's tensor and image cases, each plain and with two flows and a checkpoint load, written in an order that
    mixes them up: the page, not the file, must put each kind's load columns together and each flow's row under its
    layout's."""
    order = [("image", "enable", "lora"), ("tensor", "enable", "lora_after"), ("image", "enable", "none"),
             ("tensor", "enable", "none"), ("tensor", "pretrained", "none"), ("image", "enable", "lora_after"),
             ("tensor", "enable", "lora")]
    records = []
    for layout in ("ulysses2", "tp2"):
        for kind, load, flow in order:
            record = case(f"flux/{layout}/native/fp32/{kind}", "PASS", load=load, flow=flow)
            record["case_id"] = spell(record)
            records.append(record)
    return records


HEADS = """document.querySelectorAll("details.section").forEach(function (d) { d.open = true; });
window.__probe = function () {
  function texts(selector) {
    return Array.prototype.map.call(document.querySelectorAll(selector), function (th) {
      return th.innerText.replace(/\\s+/g, " ").trim(); });
  }
  return {columns: texts("table.matrix thead th[data-col] .outer"), rows: texts("table.matrix tbody th")};
};"""


@pytest.mark.slow
def test_browser_loads_and_flows_are_rows_under_their_layout(tmp_path):
    """A load and a flow are each a row under its layout's (each runs on a few layouts only: as columns they made
    flux's quick-plan matrix 61 columns wide), the plain row first, then the others in the order the file first names
    them; the columns stay the kinds, never one kind's load or flow among the other kind's columns."""
    got = seen(tmp_path, run(tmp_path, flow_cases()), "", HEADS)["extra"]
    assert got["columns"] == ["image", "tensor"], got
    assert got["rows"] == ["ulysses2 native", "ulysses2 native \u21b3 lora", "ulysses2 native \u21b3 lora_after",
                           "ulysses2 native \u21b3 pretrained", "tp2 native", "tp2 native \u21b3 lora",
                           "tp2 native \u21b3 lora_after", "tp2 native \u21b3 pretrained"], got
