"""The HTML report shows results.json faithfully, escapes strings, loads nothing remote, stays small on a full plan,
and in a real browser shows the failing cases first, filters, and draws a case's detail when it is opened."""

from __future__ import annotations

import html as html_lib
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.report import changed_markdown, compare_runs, render_html
from harness.report.data import base_slug, load, short
from harness.report.detail import safe_relative
from harness.report.embed import FIELDS, SPELLED, STRINGS, spelled_id

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
EVIL = "boom <script>alert('x')</script> & more"
TRACEBACK = "Traceback (most recent call last):\n  RuntimeError: <bad> shapes"


def _case(case_id: str, status: str, **overrides) -> dict:
    model, layout, backend, dtype, kind = case_id.split("/")
    model = model.split("@")[0]
    case = {
        "case_id": case_id, "model": model, "shape": "default", "kind": kind, "layout": layout,
        "world_size": 4 if layout.endswith("4") else 2, "backend": backend, "dtype": dtype, "status": status,
        "max_abs_err": 1.7e-07, "mean_abs_err": 2e-08, "max_rel_err": 3e-07, "tolerance": 1e-05,
        "baseline_err": None, "err_ratio": None, "nonfinite": 0, "dispatched": f"{backend}:2", "reason": "",
        "seconds": 0.01, "peak_mem_mb": None, "extra": {},
    }
    case.update(overrides)
    return case


HIST = {"edges": [0, 1e-7, 2e-7, 5e-7, 1e-6, 2e-5], "counts": [900, 80, 15, 4, 1]}
IMAGES = {"reference": "images/ref.png", "candidate": "images/cand.png", "diff": "images/diff.png",
          "ssim_map": "images/ssim map.png"}


def _cases() -> list[dict]:
    """Every status, an XPASS, two SKIPs with one reason, two XFAILs of one known issue with different errors."""
    return [
        _case("flux/ulysses2/native/fp32/tensor", "PASS", extra={"abs_err_hist": HIST}),
        _case("flux/ring2/native/fp32/tensor", "FAIL", max_abs_err=0.0123, reason="max_abs_err 1.2e-2 > 1e-5"),
        _case("flux/ulysses4/flex/fp32/tensor", "ERROR", max_abs_err=None, reason=EVIL,
              extra={"traceback": TRACEBACK}),
        _case("flux/tp2/native/bf16/tensor", "SKIP", max_abs_err=None, reason="tp needs CUDA"),
        _case("flux/tp4/native/bf16/tensor", "SKIP", max_abs_err=None, reason="tp needs CUDA"),
        _case("qwenimage/ring2/native/bf16/tensor", "XFAIL", max_abs_err="nan", nonfinite=12,
              reason="known issue: #12 <ring>; observed FAIL: 12 non-finite", extra={"traceback": TRACEBACK}),
        _case("qwenimage/ring4/native/bf16/tensor", "XFAIL", max_abs_err=None,
              reason="known issue: #12 <ring>; observed ERROR: boom", extra={"traceback": TRACEBACK}),
        _case("qwenimage/ulysses2/native/bf16/tensor", "TIMEOUT", max_abs_err=None, reason="exceeded 120 s"),
        _case("qwenimage/ulysses2/native/fp32/image", "PASS", ssim=0.99871, psnr=48.2, extra={
            "images": {**IMAGES, "diff": "https://evil.example/x.png"}}),
        _case("qwenimage/ulysses4/native/fp32/tensor", "XPASS",
              reason="known issue no longer reproduces (XPASS): #7 ulysses4"),
    ]


def _write(folder: Path, cases: list[dict], mismatch: str = "") -> Path:
    env = {"torch": "2.13.0+cpu", "diffusers": "0.42.1", "diffusers_commit": None, "python": "3.11.7",
           "device": "cpu (x86_64)"}
    header = {"environment": env, "reference_environment": dict(env, diffusers="0.41.0" if mismatch else "0.42.1"),
              "version_mismatch": mismatch, "counts": {}, "settings": {"case_timeout": 120},
              "started": "2026-01-01T00:00:00", "wall_s": 61.2, "launches": 2}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"header": header, "cases": cases}))
    return folder


@pytest.fixture
def page(tmp_path) -> str:
    return render_html(_write(tmp_path / "run", _cases(), mismatch="references from diffusers 0.41.0")).read_text()


def _embedded(page: str, element: str = "report-data") -> dict:
    found = re.search(rf'<script type="application/json" id="{element}">(.*?)</script>', page, re.S)
    assert found, element
    return json.loads(found.group(1))


def _decoded(page: str) -> list[dict]:
    """The embedded records read back the way the page script reads them (script.py `decode`)."""
    data, out = _embedded(page), []
    for row in data["c"]:
        case = dict(zip(FIELDS, row + [None] * (len(FIELDS) - len(row)), strict=True))
        for name in STRINGS:
            case[name] = data["s"][case[name]]
        pairs = case["extra"] or []
        case["extra"] = {data["s"][k]: data["v"][v] for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
        if "abs_err_hist" in case["extra"]:
            case["extra"]["abs_err_hist"] = dict(case["extra"]["abs_err_hist"])
            case["extra"]["abs_err_hist"]["edges"] = data["v"][case["extra"]["abs_err_hist"]["edges"]]
        case["case_id"] = spelled_id(case) if case["case_id"] == SPELLED else data["s"][case["case_id"]]
        out.append(case)
    return out


def test_records_are_embedded_once_and_read_back_whole(tmp_path, page):
    """Every field of every case comes back from the page's JSON; repeated strings (one traceback in three cases,
    one SKIP reason in two) are stored once; unsafe image paths are dropped before they reach the page."""
    _, loaded = load(tmp_path / "run")
    expected = [{name: case.get(name) for name in FIELDS} for case in loaded]
    for case in expected:
        for key in ("ssim", "psnr"):  # data.load copies the columns into extra; the page keeps them as columns
            case["extra"].pop(key, None)
    expected[8]["extra"]["images"] = {name: safe_relative(path) for name, path in IMAGES.items() if name != "diff"}
    assert expected[8]["extra"]["images"]["ssim_map"] == "images/ssim%20map.png"
    assert _decoded(page) == expected
    data = _embedded(page)
    assert data["v"].count(TRACEBACK) == 1 and data["s"].count("tp needs CUDA") == 1
    assert page.count("Traceback (most recent call last)") == 1


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
    """FAIL, ERROR, TIMEOUT, XPASS one row each with the whole reason; XFAIL per known issue and SKIP per reason,
    each with its count and ids, no row per case until opened."""
    order = [page.index(f'<section id="{key}"') for key in ("failing", "details", "known-issues", "skipped",
                                                             "passing", "matrix", "environment")]
    assert order == sorted(order)
    failing = _section(page, "failing")
    assert "Needs a look (4: 1 FAIL, 1 ERROR, 1 TIMEOUT, 1 XPASS)" in failing
    rows = re.findall(r'<span class="badge s-(\w+)">.*?<code>(.*?)</code>.*?<div class="reason-cell">(.*?)</div>',
                      failing, re.S)
    assert [(status, case_id) for status, case_id, _ in rows] == [
        ("FAIL", "flux/ring2/native/fp32/tensor"), ("ERROR", "flux/ulysses4/flex/fp32/tensor"),
        ("TIMEOUT", "qwenimage/ulysses2/native/bf16/tensor"), ("XPASS", "qwenimage/ulysses4/native/fp32/tensor")]
    assert rows[0][2] == "max_abs_err 1.2e-2 &gt; 1e-5" and rows[3][2].startswith("known issue no longer reproduces")
    xfail, skipped = _section(page, "known-issues"), _section(page, "skipped")
    assert "(2 cases, 1 issue)" in xfail and '<b class="n">2</b> <span class="why">known issue: #12 &lt;ring&gt;' \
        "</span>" in xfail
    assert "<li><code>qwenimage/{ring2,ring4}/native/bf16/tensor</code> (2)</li>" in xfail
    assert '<b class="n">2</b> <span class="why">tp needs CUDA</span>' in skipped
    assert "<li><code>flux/{tp2,tp4}/native/bf16/tensor</code> (2)</li>" in skipped
    for section in (xfail, skipped, _section(page, "passing")):
        assert "case-row" not in section and '<div class="rows"></div>' in section


def test_failing_models_open_first(tmp_path, page):
    models = re.findall(r'<details class="model" data-model="(\w+)"( open)?>', page)
    assert models == [("flux", " open"), ("qwenimage", " open")]  # both have a failing case
    cases = [_case("a/ring2/native/fp32/tensor", "PASS"), _case("b/ring2/native/fp32/tensor", "FAIL")]
    other = render_html(_write(tmp_path / "other", cases)).read_text()
    assert re.findall(r'<details class="model" data-model="(\w+)"( open)?>', other) == [("b", " open"), ("a", "")]


def test_no_remote_resources(page):
    assert not re.search(r'(?:src|href)\s*=\s*"(?:https?:)?//', page)
    assert "evil.example" not in page
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//|@import", page)


def test_header_environment_and_counts(page):
    assert 'role="alert"' in page and "references from diffusers 0.41.0" in page
    assert '<tr class="differs"><th scope="row">diffusers</th><td>0.42.1</td><td>0.41.0</td>' in page
    assert '<th scope="row">world sizes</th><td>2, 4</td>' in page
    for status, count in {"PASS": 2, "FAIL": 1, "ERROR": 1, "SKIP": 2, "XFAIL": 2, "TIMEOUT": 1, "XPASS": 1}.items():
        assert f'data-set-status="{status}" title="show only {status}"><b>{count}</b>' in page


def test_same_version_note_and_empty_run(tmp_path):
    same = render_html(_write(tmp_path / "a", _cases()[:1])).read_text()
    assert "same diffusers version (0.42.1)" in same and 'role="alert"' not in same
    assert "Nothing failed and no known issue stopped reproducing." in same
    empty = render_html(_write(tmp_path / "b", [])).read_text()
    assert "No cases in this run." in empty


def test_helpers():
    assert short(1.7e-07) == "1.7e-7" and short("inf") == "inf" and short(None) == "" and short(0.0) == "0"
    assert safe_relative("images/a b.png") == "images/a%20b.png"
    for bad in ("https://x/y.png", "//x/y.png", "/etc/passwd", "javascript:alert(1)", "C:/x.png"):
        assert safe_relative(bad) is None


def _bench():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "bench_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_plan_page_stays_small(tmp_path):
    """The synthetic full plan of benchmarks/bench_report.py (15,600 cases, ~12,800 SKIP, ~1,300 XFAIL with
    tracebacks): index.html within 3 MB, and no SKIP or XFAIL case gets a row of its own in the HTML."""
    bench = _bench()
    cases = bench.synthetic_cases()
    index = render_html(bench.write_run(tmp_path / "run", cases))
    assert len(cases) == 15_600 and index.stat().st_size <= 3_000_000, index.stat().st_size
    page = index.read_text()
    rows = len(re.findall(r'<tr class="case-row" data-i="\d+">', page))
    assert rows == sum(c.status.needs_a_look for c in cases)


def test_compare_runs_writes_the_page(tmp_path):
    old_cases = _cases()
    new_cases = [dict(c) for c in old_cases[:-2]]
    new_cases[0] = dict(new_cases[0], status="FAIL", reason="now <broken>")
    new_cases[1] = dict(new_cases[1], status="PASS", reason="")
    new_cases.append(_case("flux2/ulysses2/native/fp32/tensor", "PASS"))
    new_cases.append(_case("flux2/ring2/native/fp32/tensor", "ERROR", reason="new <case> fails"))
    old, new = _write(tmp_path / "old", old_cases), _write(tmp_path / "new", new_cases)
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
    assert f'href="index.html#{base_slug("flux/ulysses2/native/fp32/tensor")}"' in html
    assert "<h2>Only in OLD (2: 1 PASS, 1 XPASS)</h2>" in html
    assert "<li><code>qwenimage/ulysses2/native/fp32/image</code> (1)</li>" in html
    assert html.count("\u26a0 regression") == 2  # the broken case and the failing new one
    assert re.search(r'data-list="t-FAIL-PASS" data-kind="change"><summary><b class="n">1</b>', html)
    assert '<span class="why">every case only in NEW</span>' in html
    data = _embedded(html, "compare-data")
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


def test_compare_of_full_plans_stays_small(tmp_path):
    """Thousands of changed cases (every SKIP of the full plan now PASS) are a count and patterns, not rows."""
    bench = _bench()
    old_cases = [case.to_dict() for case in bench.synthetic_cases()]
    new_cases = [dict(case, status="PASS", reason="") if case["status"] == "SKIP" else case for case in old_cases]
    comparison = compare_runs(_write(tmp_path / "old", old_cases), _write(tmp_path / "new", new_cases))
    html = comparison.page.read_text()
    assert len(comparison.changed) > 12_000 and len(html) <= 1_500_000, len(html)
    assert html.count("<tr") < 20 and re.search(r'data-list="t-SKIP-PASS" data-kind="change"><summary>'
                                                 r'<b class="n">12784</b>', html)


# -- in a real browser --------------------------------------------------------------------------------------------

WINDOW = (1280, 1400)
# Runs after the page's own script: SETUP (opens things as a person would), then, once the page has drawn what was
# opened, records what a person would see. An element counts as shown only if its computed display is not "none"
# and it has a box (no box when it or an ancestor is display: none); "in view" means inside the first screen.
PROBE = """<script>
(function () {
  function shown(el) {
    var box = el.getBoundingClientRect();
    return getComputedStyle(el).display !== "none" && el.getClientRects().length > 0 && box.width > 0 &&
      box.height > 0;
  }
  function inView(el) {
    var box = el.getBoundingClientRect();
    return shown(el) && box.top >= 0 && box.bottom <= window.innerHeight && box.right <= window.innerWidth;
  }
  function slugOf(el) { return el.getAttribute("href").slice(1); }
  function record() {
    var out = {cells: {}, rows: {}, details: {}, groups: {}, models: {}, failing: [], images: [], opened: "",
               firstOpen: null};
    document.querySelectorAll("a.cell-case").forEach(function (a) { out.cells[slugOf(a)] = shown(a); });
    document.querySelectorAll("tr.case-row").forEach(function (tr) {
      out.rows[slugOf(tr.querySelector("a.case-link"))] = shown(tr);
    });
    document.querySelectorAll("details.case").forEach(function (d) { out.details[d.id] = shown(d) && d.open; });
    document.querySelectorAll("details.group").forEach(function (g) {
      out.groups[g.getAttribute("data-group")] = [shown(g), g.querySelector(".n").textContent];
    });
    document.querySelectorAll("details.model").forEach(function (m) {
      out.models[m.getAttribute("data-model")] = shown(m);
    });
    document.querySelectorAll("#failing tr.case-row").forEach(function (tr) {
      var reason = tr.querySelector(".reason-cell");
      out.failing.push([slugOf(tr.querySelector("a")), inView(tr), inView(reason) ? reason.textContent : null]);
    });
    document.querySelectorAll("#opened img").forEach(function (img) {
      var figure = img.closest("figure"), bar = figure.querySelector(".bar");
      out.images.push({src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0,
                       inView: inView(img), caption: figure.querySelector("figcaption").textContent,
                       legend: bar ? inView(bar) && getComputedStyle(bar).backgroundImage : null,
                       note: figure.querySelector(".scale-note") ? figure.querySelector(".scale-note").textContent
                         : null});
    });
    var opened = document.querySelector("#opened details.case[open]");
    if (opened) {  // in view and on top: not under the sticky filter bar
      var summary = opened.querySelector("summary"), box = summary.getBoundingClientRect();
      var top = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
      out.firstOpen = [opened.id, inView(summary) && summary.contains(top)];
    }
    out.opened = document.getElementById("opened").innerHTML;
    document.querySelectorAll("table.matrix").forEach(function (m) {  // the box around every shown table
      var b = m.getBoundingClientRect();
      var box = [b.left + scrollX, b.top + scrollY, b.right + scrollX, b.bottom + scrollY];
      if (!shown(m)) { return; }
      out.matrix = out.matrix ? [Math.min(out.matrix[0], box[0]), Math.min(out.matrix[1], box[1]),
                                 Math.max(out.matrix[2], box[2]), Math.max(out.matrix[3], box[3])] : box;
    });
    var notes = document.querySelectorAll(".skip-note");
    out.skipNotes = Array.prototype.map.call(notes, function (n) { return n.textContent; });
    out.counter = document.getElementById("shown-count").textContent;
    out.scripts = document.querySelectorAll("script").length;
    out.ready = document.documentElement.getAttribute("data-ready");
    if (window.__probe) { out.extra = window.__probe(); }  // what a test's setup asks for besides
    var pre = document.createElement("pre");
    pre.id = "probe";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  setTimeout(function () { __SETUP__ setTimeout(record, 300); }, 0);
})();
</script>"""
OPEN_ALL = 'document.querySelectorAll("details.group, details.model").forEach(function (d) { d.open = true; });'
PASS_BG, FAIL_BG, XFAIL_BG = (0xDA, 0xFB, 0xE1), (0xFF, 0xEB, 0xE9), (0xFF, 0xF3, 0xB0)
CANDIDATE, REFERENCE = (255, 0, 255), (0, 200, 200)  # the test pictures' colours, to find them on screen


def _chromium(tmp_path: Path, *args: str, window: tuple[int, int] = WINDOW) -> subprocess.CompletedProcess:
    """Headless Chromium; a DOM dump waits (in virtual time) for the probe's timers, a screenshot does not: the page
    draws its first screen synchronously, and virtual time can leave parts of a screenshot unpainted."""
    if not CHROMIUM.exists():
        pytest.skip("chromium is not installed at /usr/bin/chromium (apt-get install chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
             "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={window[0]},{window[1]}",
             f"--user-data-dir={tmp_path / 'profile'}"]
    if "--dump-dom" in args:
        flags.append("--virtual-time-budget=5000")
    return subprocess.run([str(CHROMIUM), *flags, *args], capture_output=True, text=True, timeout=300, check=False)


def _pictures(folder: Path) -> None:
    """Solid test pictures for the image cases: the reference cyan, the candidate magenta."""
    from PIL import Image

    (folder / "images").mkdir(parents=True, exist_ok=True)
    colours = {"ref.png": REFERENCE, "cand.png": CANDIDATE, "diff.png": (0, 0, 0), "ssim map.png": (250, 250, 250)}
    for name, colour in colours.items():
        Image.new("RGB", (64, 64), colour).save(folder / "images" / name)


def _browser_cases() -> list[dict]:
    """The fixture with an image FAIL first (so it is the case the page opens), and a bf16 FAIL and PASS that sit
    crosswise to flux's fp32 ones (rows ring2 and ulysses2, columns fp32 and bf16): filtering to failures keeps both
    rows and both columns of flux's table, so the two PASS cells where they cross must disappear on their own."""
    image_fail = _case("flux/ring4/native/fp32/image", "FAIL", ssim=0.7126, psnr=21.3, max_abs_err=0.5,
                       tolerance=5e-3, reason="vs fp32 reference: ssim 0.71260 < 0.9999", extra={"images": IMAGES})
    return [image_fail, *_cases(), _case("flux/ulysses2/native/bf16/tensor", "FAIL", max_abs_err=0.2,
                                         tolerance=0.15, reason="too far"),
            _case("flux/ring2/native/bf16/tensor", "PASS", max_abs_err=0.02, tolerance=0.15)]


def _run(tmp_path: Path, cases: list[dict] | None = None) -> Path:
    folder = _write(tmp_path / "run", _browser_cases() if cases is None else cases)
    _pictures(folder)
    return render_html(folder)


def _seen(tmp_path: Path, index: Path, query: str = "", setup: str = "", window: tuple[int, int] = WINDOW) -> dict:
    """What the browser shows for `?query` after `setup`: the probe's record."""
    probed = index.with_name("probed.html")
    probed.write_text(index.read_text().replace("</body>", PROBE.replace("__SETUP__", setup) + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", probed.as_uri() + query, window=window)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stdout[-2000:]
    return json.loads(html_lib.unescape(found.group(1)))


def _shot(tmp_path: Path, index: Path, name: str, query: str = "", window: tuple[int, int] = WINDOW):
    import numpy as np
    from PIL import Image

    path = tmp_path / f"{name}.png"
    done = _chromium(tmp_path, f"--screenshot={path}", index.as_uri() + query, window=window)
    assert done.returncode == 0 and path.exists(), done.stderr[-2000:]
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


def _pixels(shot, colour, area=None) -> int:
    import numpy as np

    if area is not None:
        left, top, right, bottom = (round(v) for v in area)
        shot = shot[top:bottom, left:right]
    return int((np.abs(shot - colour).max(axis=-1) <= 3).sum())


@pytest.mark.slow
def test_browser_first_screen_shows_the_failures_and_an_opened_failure(tmp_path):
    """What a reviewer sees first, without scrolling or clicking: every failing (and XPASS) case with its reason,
    and the first failure opened with its four pictures, the difference and SSIM map each with caption and scale.
    No SKIP or XFAIL case is listed one by one."""
    index = _run(tmp_path)
    seen = _seen(tmp_path, index)
    first = base_slug("flux/ring4/native/fp32/image")
    assert seen["ready"] == "1" and seen["scripts"] == 3  # records, page script, probe: nothing injected
    assert [slug for slug, in_view, _ in seen["failing"]] == [base_slug(c) for c in (
        "flux/ring4/native/fp32/image", "flux/ring2/native/fp32/tensor", "flux/ulysses2/native/bf16/tensor",
        "flux/ulysses4/flex/fp32/tensor", "qwenimage/ulysses2/native/bf16/tensor",
        "qwenimage/ulysses4/native/fp32/tensor")]
    assert all(in_view for _, in_view, _ in seen["failing"]), seen["failing"]
    reasons = [reason for _, _, reason in seen["failing"]]
    assert reasons[0] == "vs fp32 reference: ssim 0.71260 < 0.9999" and reasons[3] == EVIL  # text, not markup
    assert seen["firstOpen"] == [first, True]
    images = {image["caption"]: image for image in seen["images"]}
    assert list(images) == ["reference (fp32, single device)", "candidate", "difference \u00d710", "SSIM map"]
    assert all(image["loaded"] and image["inView"] for image in images.values()), images
    for caption, scale in (("difference \u00d710", "\u2265 0.1"), ("SSIM map", "clipped to [0, 1]")):
        assert "linear-gradient" in images[caption]["legend"], images[caption]
        assert "black" in images[caption]["note"] and scale in seen["opened"]
    statuses = {base_slug(c["case_id"]): c["status"] for c in _browser_cases()}
    assert not [slug for slug in seen["rows"] if statuses[slug] in ("SKIP", "XFAIL")]  # summarised, not listed
    shot = _shot(tmp_path, index, "first")
    assert _pixels(shot, CANDIDATE) > 10_000 and _pixels(shot, REFERENCE) > 10_000  # both pictures on screen
    assert _pixels(shot, FAIL_BG) > 500


@pytest.mark.slow
@pytest.mark.parametrize(("query", "keep"), [
    ("?skips=1", lambda c: True),
    ("?status=FAIL&skips=1", lambda c: c["status"] == "FAIL"),
    ("?failures=1&skips=1", lambda c: c["status"] in ("FAIL", "ERROR", "TIMEOUT")),
    ("?failures=1&model=flux&skips=1", lambda c: c["status"] in ("FAIL", "ERROR", "TIMEOUT") and c["model"] == "flux"),
    ("?model=qwenimage&skips=1", lambda c: c["model"] == "qwenimage"),
])
def test_browser_filters_hide_what_they_filter(tmp_path, query, keep):
    """Real chromium, every group and model section opened: the query's filters leave on screen exactly the matching
    matrix cells and case rows (computed style and box size, not the hidden attribute: a CSS display rule can
    override that attribute), groups say how many of their cases match, and empty groups and models go."""
    cases = _browser_cases()
    index = _run(tmp_path, cases)
    seen = _seen(tmp_path, index, query, OPEN_ALL)
    expected = {base_slug(c["case_id"]): keep(c) for c in cases}
    assert seen["cells"] == expected
    assert seen["rows"] == expected  # every case has exactly one row: in the failing list or in its group
    assert seen["details"] and all(expected[slug] == shown for slug, shown in seen["details"].items())
    assert seen["counter"] == f"Showing {sum(expected.values())} of {len(cases)} cases"
    groups = _embedded(index.read_text())["g"]
    for key, members in groups.items():
        kept = sum(keep(cases[i]) for i in members)
        label = str(kept) if kept == len(members) else f"{kept} of {len(members)}"
        assert seen["groups"][key] == ([True, label] if kept else [False, label]), key
    assert seen["models"] == {model: any(keep(c) for c in cases if c["model"] == model)
                              for model in ("flux", "qwenimage")}


@pytest.mark.slow
def test_browser_leaves_out_all_skip_rows_unless_asked(tmp_path):
    """flux's tp2 and tp4 rows hold only SKIP cases: left out of the matrix (with a note) until asked for."""
    index = _run(tmp_path)
    skips = [base_slug(c) for c in ("flux/tp2/native/bf16/tensor", "flux/tp4/native/bf16/tensor")]
    default, asked = _seen(tmp_path, index, "", OPEN_ALL), _seen(tmp_path, index, "?skips=1", OPEN_ALL)
    assert [default["cells"][slug] for slug in skips] == [False, False]
    assert [asked["cells"][slug] for slug in skips] == [True, True]
    assert default["skipNotes"][0].startswith("2 rows in which every case is SKIP left out")
    assert asked["skipNotes"][0] == ""
    assert sum(default["cells"].values()) == len(_browser_cases()) - 2


@pytest.mark.slow
def test_browser_screenshot_shows_no_filtered_cell(tmp_path):
    """The pixels agree: with ?status=FAIL the matrix tables show FAIL's colour and none of PASS's or XFAIL's."""
    index, tall = _run(tmp_path), (WINDOW[0], 4000)  # tall enough to hold the page down to the first matrix
    box = _seen(tmp_path, index, "?status=FAIL", window=tall)["matrix"]
    full_box = _seen(tmp_path, index, "", window=tall)["matrix"]
    for area in (box, full_box):
        assert 0 <= area[0] < area[2] <= tall[0] and 0 <= area[1] < area[3] <= tall[1], area
    everything = _shot(tmp_path, index, "all", window=tall)
    failures = _shot(tmp_path, index, "fail", "?status=FAIL", window=tall)
    counts = {colour: _pixels(everything, colour, full_box) for colour in (PASS_BG, FAIL_BG, XFAIL_BG)}
    assert min(counts.values()) > 200, counts  # unfiltered, the matrix shows all three colours
    filtered = {colour: _pixels(failures, colour, box) for colour in (PASS_BG, FAIL_BG, XFAIL_BG)}
    assert filtered[FAIL_BG] > 200 and filtered[PASS_BG] == 0 and filtered[XFAIL_BG] == 0, filtered


@pytest.mark.slow
def test_browser_draws_details_when_opened(tmp_path):
    """Cases opened from a matrix cell get their whole detail: kernels next to dispatched, whole tracebacks and
    texts, the error histogram with its tolerance line, SSIM/PSNR from the columns, a thumbnail with its note."""
    kernels = "aten::_scaled_dot_product_flash_attention_for_cpu:4 aten::<odd>:2"
    frames = "".join(f'  File "/src/module_{i}.py", line {i}, in function_{i}\n    call_{i}(x)\n' for i in range(300))
    traceback = f"Traceback (most recent call last):\n{frames}RuntimeError: the end"
    observed = "ERROR: " + "long message " * 400 + "END"
    cases = [
        _case("flux/ulysses2/_native_flash/fp32/tensor", "PASS", kernels=kernels, extra={"abs_err_hist": HIST}),
        _case("flux/ulysses2/native/fp32/tensor", "PASS", max_abs_err=0.0123),
        _case("flux/ring2/native/fp32/tensor", "ERROR", reason="rank 1: RuntimeError: the end", max_abs_err=None,
              extra={"traceback": traceback, "observed": observed}),
        _case("flux/ring2/native/fp32/image", "PASS", ssim=0.99871, psnr=48.2, max_abs_err=0.001,
              extra={"images": {"thumbnail": "images/cand.png"}}),
    ]
    slugs = [base_slug(c["case_id"]) for c in cases]
    clicks = "".join(f'document.querySelector(\'a.cell-case[href="#{slug}"]\').click();' for slug in slugs)
    seen = _seen(tmp_path, _run(tmp_path, cases), "", OPEN_ALL + f"setTimeout(function () {{ {clicks} }}, 50);")
    assert set(seen["details"]) == set(slugs) and all(seen["details"].values())
    opened = seen["opened"]

    def detail(slug: str) -> str:
        return opened.split(f'id="{slug}"', 1)[1].split("</details>", 1)[0]

    assert re.search(r'<th scope="row">dispatched</th><td><code>_native_flash:2</code></td></tr>'
                     r'<tr><th scope="row">kernels</th><td><code class="kernels">'
                     r"aten::_scaled_dot_product_flash_attention_for_cpu:4 aten::&lt;odd&gt;:2</code></td>",
                     detail(slugs[0]))
    assert '<svg class="hist"' in detail(slugs[0]) and "tolerance</text>" in detail(slugs[0])
    assert "(0.017\u00d7 tolerance)" in detail(slugs[0]) and "(1.2e+03\u00d7 tolerance)" in detail(slugs[1])
    assert '<th scope="row">kernels</th><td><code>\u2014</code> <span class="muted">(none recorded)</span>' in \
        detail(slugs[1])
    assert f'<pre class="traceback">{html_lib.escape(traceback, quote=False)}</pre>' in detail(slugs[2])
    assert f"<code>{html_lib.escape(observed, quote=False)}</code>" in detail(slugs[2]) and len(traceback) > 20_000
    assert "0.9987 / 48.20 dB" in detail(slugs[3]) and "kept for failing cases only" in detail(slugs[3])
    assert [image["caption"] for image in seen["images"]] == ["candidate (thumbnail)"]
    assert seen["images"][0]["loaded"] and seen["images"][0]["src"] == "images/cand.png"


@pytest.mark.slow
def test_browser_opens_the_case_a_link_names(tmp_path):
    """compare.html links to index.html#case-...: that case opens (filters cleared if they hid it), in view."""
    index = _run(tmp_path)
    slug = base_slug("qwenimage/ring2/native/bf16/tensor")  # an XFAIL: in a closed group, not in the HTML
    seen = _seen(tmp_path, index, f"?status=PASS#{slug}")
    assert seen["firstOpen"] == [slug, True]
    assert seen["counter"] == f"Showing {len(_browser_cases())} of {len(_browser_cases())} cases"
    assert "known issue: #12 &lt;ring&gt;; observed FAIL: 12 non-finite" in seen["opened"]


@pytest.mark.slow
def test_browser_compare_draws_rows_when_opened(tmp_path):
    """compare.html's groups hold no rows in the HTML; opened in a browser, they list their cases with links."""
    old_cases = _cases()
    new_cases = [dict(c, status="PASS", reason="") if c["status"] == "SKIP" else c for c in old_cases]
    new_cases.append(_case("flux2/ring2/native/fp32/tensor", "ERROR", reason="new <case> fails"))
    comparison = compare_runs(_write(tmp_path / "old", old_cases), _write(tmp_path / "new", new_cases))
    opener = ('<script>setTimeout(function () { document.querySelectorAll("details").forEach(function (d) '
              "{ d.open = true; }); }, 0);</script>")
    probed = comparison.page.with_name("probed.html")
    probed.write_text(comparison.page.read_text().replace("</body>", opener + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", probed.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for case_id in ("flux/tp2/native/bf16/tensor", "flux/tp4/native/bf16/tensor"):  # SKIP -> PASS, drawn on opening
        assert re.search(rf'<a href="index.html#{base_slug(case_id)}"><code>{re.escape(case_id)}</code></a></td>'
                         r'<td><span class="badge s-SKIP">SKIP</span></td><td><span class="badge s-PASS">PASS</span>',
                         dom.stdout)
        assert comparison.page.read_text().count(case_id) == 1  # in the embedded list only
    assert "new &lt;case&gt; fails" in dom.stdout and "<case>" not in dom.stdout


@pytest.mark.slow
def test_browser_shows_a_train_case_loss_curves_and_worst_gradients(tmp_path):
    """An opened train FAIL draws three loss curves (reference, layout, one device in its dtype) in their own colours,
    and the table of the gradients furthest from the reference, worst first."""
    train = {"losses": [2.24, 2.15, 1.73], "reference_losses": [2.24, 2.14, 1.72],
             "baseline_losses": [2.24, 2.14, 1.72],
             "worst_gradients": [{"param": "blocks.0.attn.to_k.bias", "rel_l2": 1.02, "max_abs": 3e-4,
                                  "baseline_rel_l2": 0.02},
                                 {"param": "context_embedder.weight", "rel_l2": 0.7, "max_abs": 2e-3,
                                  "baseline_rel_l2": 0.02}], "engine": None}
    case = _case("flux/ring4/_native_flash/bf16/train", "FAIL", reason="gradient of blocks.0.attn.to_k.bias (1.02)",
                 loss_err=8.7e-4, grad_err=2.4e-2, worst_param="blocks.0.attn.to_k.bias", extra={"train": train})
    index = render_html(_write(tmp_path / "run", [case]))
    setup = ('window.__probe = function () { var svg = document.querySelector("svg.loss");'
             ' return {lines: svg ? svg.querySelectorAll("polyline").length : 0,'
             ' colours: svg ? Array.prototype.map.call(svg.querySelectorAll("polyline"), function (p) {'
             ' return getComputedStyle(p).stroke; }) : [], shown: svg ? svg.getBoundingClientRect().height : 0,'
             ' params: Array.prototype.map.call(document.querySelectorAll("table.grads code"), function (c) {'
             ' return c.textContent; })}; };')
    probe = _seen(tmp_path, index, setup=setup)["extra"]
    assert probe["lines"] == 3 and probe["shown"] > 100
    assert len(set(probe["colours"])) == 3 and "none" not in probe["colours"]
    assert probe["params"] == ["blocks.0.attn.to_k.bias", "context_embedder.weight"]
