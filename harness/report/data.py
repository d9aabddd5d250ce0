"""Reading results.json for the report: tolerant of missing keys and of floats written as "nan"/"inf" strings."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from harness.core.errors import HarnessError
from harness.core.results import Status
from harness.report.embed import STRINGS

STATUSES = tuple(status.value for status in Status)
BAD = frozenset(status.value for status in Status if status.is_bad)
OBSERVED = "; observed "  # harness.run.verdict writes an XFAIL's reason as "<known issue or refusal>; observed <error>"
FILTER_KEYS = ("status", "model", "layout", "backend", "dtype")


def load(report_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the cases of `report_dir/results.json`, each case with every key the page reads.

    A missing, unreadable or foreign file is a HarnessError that names it and says what to do."""
    path = Path(report_dir) / "results.json"
    fix = "point at a folder that `harness run` wrote (its --report-dir), or re-run `harness run` to rewrite it"
    if not path.is_file():
        raise HarnessError(f"no results at {path}; run `harness run` first or pass the folder it wrote "
                           "(its --report-dir)")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: invalid JSON or not UTF-8
        raise HarnessError(f"{path} cannot be read as JSON ({error}); {fix}") from error
    if not _is_results(payload):
        raise HarnessError(f"{path} is not a harness results file (expected an object with a \"cases\" list of "
                           f"objects); {fix}")
    return payload.get("header") or {}, [_normalise(case) for case in payload["cases"]]


def _is_results(payload: Any) -> bool:
    """The shape results.write_results gives: {"header": {...}, "cases": [{...}, ...]}."""
    if not isinstance(payload, dict) or not isinstance(payload.get("header") or {}, dict):
        return False
    cases = payload.get("cases")
    return isinstance(cases, list) and all(isinstance(case, dict) for case in cases)


def _normalise(case: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults so rendering never meets a missing key; an unknown status is shown, not dropped."""
    out = dict(case)
    for key in ("case_id", *sorted(STRINGS - {"shape", "status"})):  # the page's text fields, never None
        out[key] = "" if out.get(key) is None else str(out[key])
    out["shape"] = str(out.get("shape") or "default")
    out["kind"] = out["kind"] or "tensor"
    out["status"] = str(out.get("status") or "ERROR").upper()
    out["extra"] = dict(out["extra"]) if isinstance(out.get("extra"), dict) else {}
    for key in ("ssim", "psnr"):  # image metrics are top-level columns of results.json; the page reads them here
        if out.get(key) is not None:
            out["extra"].setdefault(key, out[key])
    return out


def number(value: Any) -> float | None:
    """A JSON number, or one of the strings "nan"/"inf"/"-inf" that results.py writes for non-finite floats."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def short(value: Any) -> str:
    """Compact scientific form for matrix cells: 1.7e-07 -> "1.7e-7"; empty when there is no number. The page
    script's `short` writes the same."""
    x = number(value)
    if x is None:
        return ""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def base_slug(case_id: str) -> str:
    """An anchor id for a case: stable across runs, so compare.html can link into index.html."""
    return "case-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", case_id).strip("-") or "unnamed")


def slugs(cases: list[dict[str, Any]]) -> list[str]:
    """One unique anchor per case, in order; a clash (two ids folding to one slug) gets a numeric suffix."""
    seen: dict[str, int] = {}
    out = []
    for case in cases:
        slug = base_slug(case["case_id"])
        seen[slug] = seen.get(slug, 0) + 1
        out.append(slug if seen[slug] == 1 else f"{slug}-{seen[slug]}")
    return out


def unique(values) -> list[str]:
    """Distinct values in order of first appearance, which is the plan's order."""
    return list(dict.fromkeys(values))


def status_counts(cases: list[dict[str, Any]]) -> dict[str, int]:
    """Counts from the cases themselves (the truth on this page), known statuses first then any other."""
    counts = {status: 0 for status in STATUSES}
    for case in cases:
        counts[case["status"]] = counts.get(case["status"], 0) + 1
    return counts


def shown_status(case: dict[str, Any]) -> str:
    """The status a case is shown with (XPASS, a known issue that no longer reproduces, is a status of its own)."""
    return case["status"]


def issue_of(case: dict[str, Any]) -> str:
    """The known issue (or expected refusal) an XFAIL matched, without the observed error that differs per case."""
    return case["reason"].split(OBSERVED, 1)[0]


def key_number(case: dict[str, Any]) -> str:
    """The one number a matrix cell shows: SSIM for image cases, otherwise the max abs error."""
    ssim = number(case["extra"].get("ssim"))
    if ssim is not None:  # only picture kinds measure one
        return f"SSIM {ssim:.4f}"
    return short(case.get("max_abs_err"))


def plain(value: Any, spec: str = ".2f") -> str:
    """Fixed-point for quantities people read as amounts (seconds, megabytes)."""
    x = number(value)
    if x is None:
        return "\u2014"
    return format(x, spec) if math.isfinite(x) else str(x)
