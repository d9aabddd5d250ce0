"""`results.partial.jsonl`: every finished case, appended as it finishes, so that a run that ends early (Ctrl-C, a
killed process, an internal error) loses nothing and `harness run --resume` goes on from it.

Its first line is the run's fingerprint: a verdict is kept only by a run made under the same options, versions and
references. A run killed mid-write leaves a torn last line; only whole lines count, and a resumed run cuts the file
back to them before it appends.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.results import CaseResult
from harness.run.launchers import OWN_OPTIONS
from harness.run.settings import Settings
from harness.run.tail import complete_lines

PARTIAL = "results.partial.jsonl"

# where and how a run ran, not what it checks: a resumed run may change these
_WHERE = ("report_dir", "case_timeout", "keep_work", *OWN_OPTIONS, "gpus_per_node", "compile_cache")


def fingerprint(settings: Settings, versions: dict, metas: dict) -> str:
    """What a kept verdict depends on: the options (where the reports go and how long a case may take aside), the
    versions of this run and the references' checksums."""
    options = {key: value for key, value in settings.values.items() if key not in _WHERE}
    checksums = {"/".join(key): meta.get("checksum") for key, meta in sorted(metas.items())}
    payload = json.dumps([options, versions["environment"], checksums], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def resume(report_dir: Path, asked: bool, echo=print, fingerprint: str = "") -> dict[str, CaseResult]:
    """Finished cases of an interrupted run, when asked to resume and made under the same options, versions and
    references; otherwise start clean."""
    path = report_dir / PARTIAL
    if not asked or not path.exists():
        if asked:
            echo(f"note: nothing to resume in {report_dir} (no {PARTIAL}): running the whole plan")
        path.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
        return {}
    data = path.read_bytes()
    lines, whole = complete_lines(data)
    first = _json(lines[0]) if lines else None
    if not isinstance(first, dict) or first.get("fingerprint") != fingerprint:
        raise HarnessError(f"cannot --resume the run in {report_dir}: its options, diffusers/torch versions or "
                           "references differ from this run's (its verdicts would not be this run's); rerun without "
                           "--resume")
    if whole < len(data):  # a line torn by a run killed mid-write: its case reruns, and the next line starts clean
        with open(path, "r+b") as handle:
            handle.truncate(whole)
    kept = {}
    for line in lines[1:]:
        try:
            result = CaseResult.from_dict(json.loads(line))
        except (ValueError, TypeError):  # blank or not a record: that case reruns
            continue
        kept[result.case_id] = result
    return kept


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None
