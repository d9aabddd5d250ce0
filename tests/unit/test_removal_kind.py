"""The removal kind's check, with its controls: a removal that hands the model back whole passes (the check can
pass: bit for bit, no collective), no removal at all fails both checks (the check sees a model that kept its
layout), and diffusers' own `remove_context_parallel` fails as known_issues.toml says (its finding)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

VARIANTS = '''
"""Two removals beside diffusers' own: a whole one (hooks and every processor's parallel config) and none."""

from harness.kinds import register
from harness.kinds.removal import RemovalKind


class Whole(RemovalKind):
    name = "removal_whole"

    def remove(self, model, plan):
        super().remove(model, plan)
        for module in model.modules():
            if getattr(getattr(module, "processor", None), "_parallel_config", None) is not None:
                module.processor._parallel_config = None
        model._parallel_config = None


class Nothing(RemovalKind):
    name = "removal_none"

    def remove(self, model, plan):
        pass


register(Whole())
register(Nothing())
'''


def test_removal_passes_whole_fails_kept_and_shows_diffusers_finding(project, monkeypatch):
    (project / "removal_variants.py").write_text(VARIANTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HARNESS_KINDS", "removal_variants")
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--models", "flux", "--layouts", "ulysses2,ring2",
                           "--backends", "_native_flash", "--dtypes", "fp32", "--kinds",
                           "removal,removal_whole,removal_none", "--report-dir", "out"],
                          cwd=project, capture_output=True, text=True, timeout=900)
    with open(project / "out" / "matrix.csv") as handle:
        rows = {row["case_id"]: row for row in csv.DictReader(handle)}
    said = done.stdout + done.stderr
    for layout in ("ulysses2", "ring2"):
        whole = rows[f"flux/{layout}/_native_flash/fp32/removal_whole"]
        assert whole["status"] == "PASS", said
        assert float(whole["removed_max_abs"]) == 0.0 and int(whole["removed_collectives"]) == 0
        kept = rows[f"flux/{layout}/_native_flash/fp32/removal_none"]
        assert kept["status"] == "FAIL" and int(kept["removed_collectives"]) > 0, said
        assert float(kept["removed_max_abs"]) > 0, said  # the layout's own rounding: not the one-device output
        diffusers = rows[f"flux/{layout}/_native_flash/fp32/removal"]
        assert diffusers["status"] == "FAIL" and int(diffusers["removed_collectives"]) > 0, said
    assert float(rows["flux/ulysses2/_native_flash/fp32/removal"]["removed_max_abs"]) > 0
