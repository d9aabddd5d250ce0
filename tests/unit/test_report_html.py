"""The HTML report shows results.json faithfully, escapes strings, loads nothing remote, and filters in a browser."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from harness.report import changed_markdown, compare_runs, render_html
from harness.report.data import base_slug, short
from harness.report.detail import histogram_svg, safe_relative

CHROMIUM = Path("/usr/bin/chromium")
EVIL = "boom <script>alert('x')</script> & more"


def _case(case_id: str, status: str, **overrides) -> dict:
    model, layout, backend, dtype, kind = case_id.split("/")
    case = {
        "case_id": case_id, "model": model, "shape": "default", "kind": kind, "layout": layout,
        "world_size": 4 if layout.endswith("4") else 2, "backend": backend, "dtype": dtype, "status": status,
        "max_abs_err": 1.7e-07, "mean_abs_err": 2e-08, "max_rel_err": 3e-07, "tolerance": 1e-05,
        "baseline_err": None, "err_ratio": None, "nonfinite": 0, "dispatched": f"{backend}:2", "reason": "",
        "seconds": 0.01, "peak_mem_mb": None, "extra": {},
    }
    case.update(overrides)
    return case


def _cases() -> list[dict]:
    hist = {"edges": [0, 1e-7, 2e-7, 5e-7, 1e-6, 2e-5], "counts": [900, 80, 15, 4, 1]}
    return [
        _case("flux/ulysses2/native/fp32/tensor", "PASS", extra={"abs_err_hist": hist}),
        _case("flux/ring2/native/fp32/tensor", "FAIL", max_abs_err=0.0123, reason="max_abs_err 1.2e-2 > 1e-5"),
        _case("flux/ulysses4/flex/fp32/tensor", "ERROR", max_abs_err=None, reason=EVIL,
              extra={"traceback": "Traceback (most recent call last):\n  RuntimeError: <bad> shapes"}),
        _case("flux/tp2/native/bf16/tensor", "SKIP", max_abs_err=None, reason="tp2 needs CUDA"),
        _case("qwenimage/ring2/native/bf16/tensor", "XFAIL", max_abs_err="nan", nonfinite=12,
              reason="known issue #12 <ring>"),
        _case("qwenimage/ulysses2/native/bf16/tensor", "TIMEOUT", max_abs_err=None, reason="exceeded 120 s"),
        _case("qwenimage/ulysses2/native/fp32/image", "PASS", extra={
            "ssim": 0.99871, "psnr": 48.2,
            "images": {"reference": "images/ref.png", "candidate": "images/cand.png",
                       "diff": "https://evil.example/x.png", "ssim_map": "images/ssim map.png"}}),
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


def _cell(page: str, case_id: str) -> str:
    match = re.search(rf'<a class="cell-case[^>]*href="#{re.escape(base_slug(case_id))}"[^>]*>.*?</a>', page)
    assert match, case_id
    return match.group(0)


def test_matrix_cells_carry_status_number_and_link(page):
    for case in _cases():
        cell = _cell(page, case["case_id"])
        assert f"s-{case['status']}" in cell and f"<b>{case['status']}</b>" in cell
    assert "1.7e-7" in _cell(page, "flux/ulysses2/native/fp32/tensor")
    assert "1.2e-2" in _cell(page, "flux/ring2/native/fp32/tensor")
    assert "SSIM 0.9987" in _cell(page, "qwenimage/ulysses2/native/fp32/image")
    assert 'title="known issue #12 &lt;ring&gt;"' in _cell(page, "qwenimage/ring2/native/bf16/tensor")
    assert "flux fp32 tensor" in page and "qwenimage fp32 image" in page  # kind joins the row label when mixed


def test_every_string_is_escaped(page):
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page
    assert "&lt;bad&gt; shapes" in page
    assert page.count("<script>") == 1  # only the page's own inline script


def test_details_sections(page):
    for case in _cases():
        detail = f'<details class="case filterable" id="{base_slug(case["case_id"])}"'
        assert (detail in page) == (case["status"] != "SKIP")  # a SKIP's reason is in the table and tooltip
    assert "Traceback (most recent call last)" in page
    assert "(1.2e+03\u00d7 tolerance)" in page
    assert '<svg class="hist"' in page and "tolerance</text>" in page
    assert 'src="images/ref.png"' in page and 'src="images/ssim%20map.png"' in page


def test_no_remote_resources(page):
    assert not re.search(r'(?:src|href)\s*=\s*"(?:https?:)?//', page)
    assert "evil.example" not in page
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//|@import", page)


def test_header_environment_and_counts(page):
    assert 'role="alert"' in page and "references from diffusers 0.41.0" in page
    assert '<tr class="differs"><th scope="row">diffusers</th><td>0.42.1</td><td>0.41.0</td>' in page
    assert '<th scope="row">world sizes</th><td>2, 4</td>' in page
    for status, count in {"PASS": 2, "FAIL": 1, "ERROR": 1, "SKIP": 1, "XFAIL": 1, "TIMEOUT": 1}.items():
        assert f'data-set-status="{status}" title="show only {status}"><b>{count}</b>' in page
    assert page.count('<tr class="case-row filterable"') == len(_cases())


def test_same_version_note_and_empty_run(tmp_path):
    same = render_html(_write(tmp_path / "a", _cases()[:1])).read_text()
    assert "same diffusers version (0.42.1)" in same and 'role="alert"' not in same
    empty = render_html(_write(tmp_path / "b", [])).read_text()
    assert "No cases in this run." in empty


def test_helpers():
    assert short(1.7e-07) == "1.7e-7" and short("inf") == "inf" and short(None) == "" and short(0.0) == "0"
    assert safe_relative("images/a b.png") == "images/a%20b.png"
    for bad in ("https://x/y.png", "//x/y.png", "/etc/passwd", "javascript:alert(1)", "C:/x.png"):
        assert safe_relative(bad) is None
    assert histogram_svg([0, 1, 2], [5, 0]).count("<rect") == 2


def test_compare_runs_finds_changes(tmp_path):
    old_cases = _cases()
    new_cases = [dict(c) for c in old_cases[:-1]]
    new_cases[0] = dict(new_cases[0], status="FAIL", reason="now <broken>")
    new_cases[1] = dict(new_cases[1], status="PASS", reason="")
    new_cases.append(_case("flux2/ulysses2/native/fp32/tensor", "PASS"))
    old, new = _write(tmp_path / "old", old_cases), _write(tmp_path / "new", new_cases)
    render_html(new)
    path, changes = compare_runs(old, new)
    assert path == new / "compare.html"
    by_id = {c["case_id"]: c for c in changes}
    assert set(by_id) == {"flux/ulysses2/native/fp32/tensor", "flux/ring2/native/fp32/tensor",
                          "qwenimage/ulysses2/native/fp32/image", "flux2/ulysses2/native/fp32/tensor"}
    assert changes[0]["case_id"] == "flux/ulysses2/native/fp32/tensor"  # the regression leads
    assert by_id["flux/ulysses2/native/fp32/tensor"] == {
        "case_id": "flux/ulysses2/native/fp32/tensor", "old": "PASS", "new": "FAIL", "old_reason": "",
        "new_reason": "now <broken>"}
    assert by_id["qwenimage/ulysses2/native/fp32/image"]["new"] is None
    assert by_id["flux2/ulysses2/native/fp32/tensor"]["old"] is None
    html = path.read_text()
    assert "now &lt;broken&gt;" in html and "<broken>" not in html
    assert f'href="index.html#{base_slug("flux/ulysses2/native/fp32/tensor")}"' in html
    markdown = changed_markdown(changes)
    assert "| `flux/ulysses2/native/fp32/tensor` | PASS | FAIL \u26a0 | now <broken> |" in markdown
    assert "(absent)" in markdown and changed_markdown([]) == "No status changes.\n"
    other, _ = compare_runs(old, new, out_dir=tmp_path / "out")
    assert other == tmp_path / "out" / "compare.html" and 'href="../new/index.html' in other.read_text()


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
             "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([str(CHROMIUM), *flags, *args], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.slow
def test_browser_filters_and_screenshot(tmp_path):
    """Real chromium: the script applies the query's filters to matrix, table and details, and the page paints."""
    if not CHROMIUM.exists():
        pytest.skip("chromium is not installed at /usr/bin/chromium (apt-get install chromium)")
    index = render_html(_write(tmp_path / "run", _cases()))
    start = time.monotonic()
    dom = _chromium(tmp_path, "--dump-dom", index.as_uri() + "?failures=1&model=flux")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert '<html lang="en" class="js" data-ready="1">' in html and "Showing 2 of 7 cases" in html
    rows = re.findall(r'<tr class="case-row filterable"([^>]*)>', html)
    visible = [r for r in rows if "hidden" not in r]
    assert len(visible) == 2 and all(re.search(r'data-status="(FAIL|ERROR)"', r) for r in visible)
    assert all('data-model="flux"' in r for r in visible)
    assert re.search(r'<details class="case filterable" id="case-flux-ulysses2-native-fp32-tensor"[^>]*hidden', html)
    shot = tmp_path / "report.png"
    result = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1400", index.as_uri())
    assert result.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert time.monotonic() - start < 30


def test_image_metrics_from_top_level_columns(tmp_path):
    """results.json keeps ssim/psnr as columns; the matrix cell and the detail show them for image cases."""
    import json

    from harness.report.html import render_html

    case = {"case_id": "flux/ulysses2/native/fp32/image", "model": "flux", "kind": "image", "layout": "ulysses2",
            "backend": "native", "dtype": "fp32", "status": "FAIL", "ssim": 0.7126, "psnr": 21.3,
            "max_abs_err": 0.5, "reason": "vs fp32 reference: ssim 0.71260 < 0.9999", "extra": {}}
    (tmp_path / "results.json").write_text(json.dumps({"header": {}, "cases": [case]}))
    page = render_html(tmp_path).read_text()
    assert "SSIM 0.7126" in page and "0.7126 / 21.30 dB" in page
