"""Shared by the report page tests: results.json records as a run writes them, and what a real Chromium shows of a
page (the probe records computed style and boxes, not DOM attributes: a CSS rule can override `hidden`)."""

from __future__ import annotations

import html as html_lib
import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.core.figures import FigureSpec, histogram, images, series, table
from harness.core.header import RunHeader
from harness.core.results import CaseResult, Status, write_results

CHROMIUM = Path("/usr/bin/chromium")
EVIL = "boom <script>alert('x')</script> & more"
TRACEBACK = "Traceback (most recent call last):\n  RuntimeError: <bad> shapes"
HIST = histogram("Absolute error histogram", [0, 1e-7, 2e-7, 5e-7, 1e-6, 2e-5], [900, 80, 15, 4, 1], 1e-5)
IMAGES = {"reference": "images/ref.png", "candidate": "images/cand.png", "diff": "images/diff.png",
          "ssim_map": "images/ssim map.png"}
CAPTIONS = {"reference": "reference (fp32, single device)", "diff": "difference \u00d710", "ssim_map": "SSIM map"}
SCALES = {"diff": {"ticks": ["0", "0.05", "\u2265 0.1"], "note": "black = equal, full brightness = off by 0.1"},
          "ssim_map": {"ticks": ["\u2264 0", "0.5", "1"],
                       "note": "white = same structure, black = none; clipped to [0, 1]"}}
MAX_ABS = FigureSpec("max_abs_err", "max abs err", cell="{value:.1e}")
MEAN_ABS = FigureSpec("mean_abs_err", "mean abs err")
NONFINITE = FigureSpec("nonfinite", "non-finite values", "d")
SSIM = FigureSpec("ssim", "SSIM", ".6f", cell="ssim {value:.4f}")
PSNR = FigureSpec("psnr", "PSNR (dB)", ".2f")
GRAD = FigureSpec("grad_err", "gradient rel L2 err", cell="g{value:.0e}")
WORST = FigureSpec("worst_param", "worst gradient", "")


def tensor(value: float | str = 1.7e-07, limit: float = 1e-5) -> list[dict]:
    return [MAX_ABS.of(value, limit), MEAN_ABS.of(2e-08), NONFINITE.of(0)]


def picture(ssim: float, psnr: float, limit: float = 0.9999) -> list[dict]:
    return [SSIM.of(ssim, limit), PSNR.of(psnr, 60.0), MAX_ABS.of(0.5, 5e-3)]


def case(case_id: str, status: str, **overrides) -> dict:
    """A results.json record, written by a real `CaseResult` (a field that moved or is misspelt fails here): the id's
    parts as its axes, tensor figures unless told otherwise."""
    head, layout, backend, dtype, kind = case_id.split("/")
    model, _, shape = head.partition("@")
    fields = {"figures": tensor(), "dispatched": f"{backend}:2", "seconds": 0.01, **overrides}
    return CaseResult(case_id, model, shape or "default", kind.split("+")[0], layout, 4 if layout.endswith("4") else 2,
                      backend, dtype, Status(status), **fields).to_dict()


def cases() -> list[dict]:
    """Every status, an XPASS, two SKIPs with one reason, two XFAILs of one known issue with different errors."""
    return [
        case("flux/ulysses2/native/fp32/tensor", "PASS", extra={"blocks": [HIST]}),
        case("flux/ring2/native/fp32/tensor", "FAIL", figures=tensor(0.0123), reason="max_abs_err 1.2e-2 > 1e-5",
             evidence=[{"check": "max_abs", "text": "max_abs_err 1.2e-2 > 1e-5", "value": 0.0123, "limit": 1e-5}]),
        case("flux/ulysses4/flex/fp32/tensor", "ERROR", figures=[], reason=EVIL, extra={"traceback": TRACEBACK}),
        case("flux/tp2/native/bf16/tensor", "SKIP", figures=[], reason="tp needs CUDA"),
        case("flux/tp4/native/bf16/tensor", "SKIP", figures=[], reason="tp needs CUDA"),
        case("qwenimage/ring2/native/bf16/tensor", "XFAIL", figures=tensor("nan"),
             reason="known issue: #12 <ring>; observed FAIL: 12 non-finite", extra={"traceback": TRACEBACK}),
        case("qwenimage/ring4/native/bf16/tensor", "XFAIL", figures=[],
             reason="known issue: #12 <ring>; observed ERROR: boom", extra={"traceback": TRACEBACK}),
        case("qwenimage/ulysses2/native/bf16/tensor", "TIMEOUT", figures=[], reason="exceeded 120 s"),
        case("qwenimage/ulysses2/native/fp32/image", "PASS", figures=picture(0.99871, 48.2, 0.99),
             extra={"images": {**IMAGES, "diff": "https://evil.example/x.png"}}),
        case("qwenimage/ulysses4/native/fp32/tensor", "XPASS",
             reason="known issue no longer reproduces (XPASS): #7 ulysses4"),
    ]


# A known_issues.toml entry as a result carries it (harness.run.known_issues.KnownIssue.reference); `<` to be escaped
KNOWN = {"key": "known_issues.toml #13", "title": "tensor parallelism: wrong <QK-norm> gradients",
         "link": "https://github.com/huggingface/diffusers/blob/v0.42.1/src/diffusers/hooks/tensor_parallel.py#L586",
         "severity": "silently wrong"}


def known_xfail(case_id: str = "flux/tp2/native/fp32/train", entry: dict | None = None) -> dict:
    """A train case every failed check of which the entry excuses, each in the band the entry measured (the loss
    check has none), as harness.run.verdict.apply_known_issues leaves it."""
    entry = entry or KNOWN
    items = [{"check": "grad_rel", "text": f"gradient of blocks.0.attn.norm_{q}.weight 0.9 > 1e-4",
              "subject": f"blocks.0.attn.norm_{q}.weight", "value": value, "limit": 1e-4, "known": entry["key"],
              "band": [0.3, 1.75]} for q, value in (("q", 0.97), ("k", 0.72))]
    items.append({"check": "loss_rel", "text": "loss rel err 3e-4 > 1e-5", "value": 3e-4, "limit": 1e-5,
                  "known": entry["key"]})
    reason = f"known issue: per-head norms act on sharded heads ({entry['link']}); observed FAIL: gradients"
    return case(case_id, "XFAIL", figures=[GRAD.of(0.0017, 1e-4)], evidence=items, known_issues=[entry],
                reason=reason, extra={"known_issue": [entry["key"]]})


def train_blocks(losses: list[float], reference: list[float], baseline: list[float]) -> list[dict]:
    lines = [("reference (fp32, one device)", reference, "ref"), ("this layout", losses, "run"),
             ("one device, bf16", baseline, "base")]
    rows = [["transformer_blocks.0.attn.very_long_parameter_name_that_wraps.linear_1.weight", 2.266e-06, 3e-4, 0.02,
             0.03, 0.06], ["context_embedder.weight", 0.7, 2e-3, 0.02, 0.03, 0.06]]
    return [series("Loss per step", lines), table("Step-1 gradients furthest from the reference",
                                                  ["parameter", "rel L2 err", "max abs err", "one device",
                                                   "largest noise draw", "limit"], rows, (0,))]


def image_block() -> dict:
    return images("Images", dict(IMAGES), CAPTIONS, SCALES)


def write(folder: Path, records: list[dict], mismatch: str = "", **header) -> Path:
    """results.json as `harness run` writes it (each traceback once), from records."""
    env = {"torch": "2.13.0+cpu", "diffusers": "0.42.1", "diffusers_commit": None, "python": "3.11.7",
           "device": "cpu (x86_64)"}
    head = {"environment": env, "reference_environment": dict(env, diffusers="0.41.0" if mismatch else "0.42.1"),
            "version_mismatch": mismatch, "counts": {}, "settings": {"case_timeout": 120},
            "started": "2026-01-01T00:00:00", "wall_s": 61.2, "launches": 2, **header}
    write_results(folder / "results.json", [CaseResult.from_dict(r) for r in records], RunHeader.from_dict(head))
    return folder


def embedded(page: str, element: str = "report-data") -> dict:
    found = re.search(rf'<script type="application/json" id="{element}">(.*?)</script>', page, re.S)
    assert found, element
    return json.loads(found.group(1))


# -- in a real browser --------------------------------------------------------------------------------------------

WINDOW = (1280, 1400)
# Runs after the page's own script: SETUP (opens things as a person would), then, once the page has drawn what was
# opened, records what a person would see. An element counts as shown only if its computed display is not "none"
# and it has a box (no box when it or an ancestor is display: none); "in view" means inside the first screen.
PROBE = (Path(__file__).with_name("report_probe.js")).read_text()
OPEN_ALL = 'document.querySelectorAll("details.group, details.section").forEach(function (d) { d.open = true; });'


def chromium(tmp_path: Path, *args: str, window: tuple[int, int] = WINDOW) -> subprocess.CompletedProcess:
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


def seen(tmp_path: Path, page: Path, fragment: str = "", setup: str = "", window: tuple[int, int] = WINDOW) -> dict:
    """What the browser shows for the page's URL plus `fragment` (?query#hash) after `setup`: the probe's record."""
    probed = page.with_name("probed-" + page.name)
    probed.write_text(page.read_text().replace("</body>", "<script>" + PROBE.replace("/*SETUP*/", setup) +
                                               "</script></body>"))
    dom = chromium(tmp_path, "--dump-dom", probed.as_uri() + fragment, window=window)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stdout[-2000:]
    return json.loads(html_lib.unescape(found.group(1)))


def shot(tmp_path: Path, page: Path, name: str, fragment: str = "", window: tuple[int, int] = WINDOW):
    import numpy as np
    from PIL import Image

    path = tmp_path / f"{name}.png"
    done = chromium(tmp_path, f"--screenshot={path}", page.as_uri() + fragment, window=window)
    assert done.returncode == 0 and path.exists(), done.stderr[-2000:]
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


def pixels(picture, colour, area=None) -> int:
    import numpy as np

    if area is not None:
        left, top, right, bottom = (round(v) for v in area)
        picture = picture[top:bottom, left:right]
    return int((np.abs(picture - colour).max(axis=-1) <= 3).sum())


def pictures(folder: Path, colours: dict[str, tuple[int, int, int]]) -> None:
    """Solid test pictures under folder/images."""
    from PIL import Image

    (folder / "images").mkdir(parents=True, exist_ok=True)
    for name, colour in colours.items():
        Image.new("RGB", (64, 64), colour).save(folder / "images" / name)
