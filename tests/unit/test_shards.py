"""`--shard K/N` and `harness merge`: every planned case in exactly one part, parts balanced and deterministic, and
a merge that proves the parts are whole or names what is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.core.errors import HarnessError
from harness.core.header import RunHeader
from harness.core.results import CaseResult, Status, write_results
from harness.report.idsets import describe
from harness.run import runner, shards
from harness.run.merge import merge_runs
from harness.run.plan import build_plan
from harness.run.settings import OPTIONS


def _plan():
    return build_plan(["flux", "flux2", "qwenimage"], OPTIONS["layouts"].default, ["native", "_native_flash"],
                      ["fp32", "bf16"], ["default", "masked"], kinds=["tensor", "image"])


@pytest.mark.parametrize("spec", ["0/3", "4/3", "1", "a/b", "2/0"])
def test_a_bad_shard_says_what_to_give(spec):
    with pytest.raises(HarnessError, match=r"option shard: .* is not K/N with 1 <= K <= N; give e.g. --shard 2/3"):
        shards.parse(spec)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_case_lands_in_exactly_one_part_with_its_model_and_world_size(count):
    plan = _plan()
    parts = [shards.select(plan, f"{k}/{count}") for k in range(1, count + 1)]
    ids = [p.case.case_id for part in parts for p in part.plan]
    assert sorted(ids) == sorted(p.case.case_id for p in plan) and len(ids) == len(set(ids))
    for part in parts:  # in plan order, and a model's world size never split over two parts
        order = [plan.index(p) for p in part.plan]
        assert order == sorted(order)
        others = {shards.unit(p) for other in parts if other is not part for p in other.plan}
        assert not {shards.unit(p) for p in part.plan} & others
    again = [shards.select(plan, f"{k}/{count}").plan for k in range(1, count + 1)]
    assert again == [part.plan for part in parts]  # the same options give the same parts on every CI job


def test_parts_are_balanced_by_predicted_cost():
    plan = _plan()
    costs = {}
    for planned in plan:
        costs[shards.unit(planned)] = costs.get(shards.unit(planned), 0.0) + shards.cost(planned)
    loads = []
    for k in (1, 2, 3):
        part = shards.select(plan, f"{k}/3").plan
        loads.append(sum(map(shards.cost, part)) + shards.STARTUP_S * len({p.case.world_size for p in part}))
    assert max(loads) - min(loads) <= max(costs.values()) + shards.STARTUP_S, loads
    assert min(loads) > 0.5 * max(loads), loads  # 9 units over 3 parts: none left nearly idle
    (skipped,) = build_plan(["flux"], ["ulysses8"], ["native"], ["fp32"])  # more ranks than allowed here
    assert not skipped.runs and shards.cost(skipped) == 0.0 < shards.cost(plan[0])


def _write_part(folder, plan, spec, status=Status.PASS, drop=()):
    shard = shards.select(plan, spec)
    results = [CaseResult(p.case.case_id, p.case.model, p.case.shape, p.case.kind, p.case.layout.name,
                          p.case.world_size, p.case.backend, p.case.dtype, status if p.runs else Status.SKIP)
               for p in shard.plan if p.case.case_id not in drop]
    header = {"environment": {"torch": "t", "diffusers": "d", "device": "cpu"}, "settings": {"shard": spec},
              "wall_s": 10.0, "launches": 2, "shard": shard.header, "started": "2026-01-01T00:00:00"}
    write_results(folder / "results.json", results, RunHeader.from_dict(header))
    return shard


def test_merge_puts_the_parts_back_in_plan_order(tmp_path):
    plan = _plan()
    folders = [tmp_path / f"part{k}" for k in (1, 2, 3)]
    for k, folder in enumerate(folders, 1):
        _write_part(folder, plan, f"{k}/3")
    results, header = merge_runs(list(reversed(folders)), tmp_path / "merged")
    assert [r.case_id for r in results] == [p.case.case_id for p in plan]
    written = json.loads((tmp_path / "merged/results.json").read_text())
    assert [case["case_id"] for case in written["cases"]] == [p.case.case_id for p in plan]
    assert written["header"]["counts"]["PASS"] == sum(p.runs for p in plan)
    assert [part["shard"] for part in written["header"]["merged_from"]] == ["3/3", "2/3", "1/3"]
    assert written["header"]["launches"] == 6 and written["header"]["settings"]["shard"] == ""
    assert (tmp_path / "merged/index.html").exists() and (tmp_path / "merged/matrix.csv").exists()


def test_a_missing_or_unfinished_part_is_named_with_the_cases_it_lacks(tmp_path):
    plan = _plan()
    second = _write_part(tmp_path / "p2", plan, "2/3")
    dropped = second.plan[0].case.case_id
    _write_part(tmp_path / "p1", plan, "1/3", drop=(dropped,))  # not in part 1: changes nothing there
    _write_part(tmp_path / "p2", plan, "2/3", drop=(dropped,))  # an interrupted part
    with pytest.raises(HarnessError) as error:
        merge_runs([tmp_path / "p1", tmp_path / "p2"], tmp_path / "merged")
    text = str(error.value)
    third = [p.case.case_id for p in shards.select(plan, "3/3").plan]
    assert text.startswith("cannot merge: every planned case must come from exactly one part; ")
    assert f"part 2/3 ({tmp_path / 'p2'}) lacks 1 planned case(s): `{dropped}`" in text
    assert f"part 3/3 is missing (no folder given holds it): {len(third)} planned case(s): " in text
    assert not (tmp_path / "merged").exists()  # nothing written from a partial merge


def test_a_part_given_twice_or_cut_from_another_plan_or_not_a_part_is_refused(tmp_path):
    plan = _plan()
    _write_part(tmp_path / "a", plan, "1/3")
    _write_part(tmp_path / "b", plan, "1/3")
    with pytest.raises(HarnessError, match="part 1/3 given twice: "):
        merge_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    _write_part(tmp_path / "c", plan[:-1], "2/3")
    with pytest.raises(HarnessError, match=r"part 2/3 \(.*c\) was cut from another plan than part 1/3"):
        merge_runs([tmp_path / "a", tmp_path / "c"], tmp_path / "merged")
    write_results(tmp_path / "whole/results.json", [], RunHeader.from_dict({}))
    with pytest.raises(HarnessError, match="whole: not a part of a sharded run"):
        merge_runs([tmp_path / "whole"], tmp_path / "merged")
    with pytest.raises(HarnessError, match=r"no results at .*nowhere/results\.json; merge the folders that `harness "
                                           r"run --shard K/N` wrote \(their --report-dir\)"):
        merge_runs([tmp_path / "a", tmp_path / "nowhere"], tmp_path / "merged")


@pytest.mark.slow
def test_three_parts_merged_are_the_unsharded_run(project, zoo_references, settings_for):
    """Four real runs (about 2 minutes on 2 busy cores): parts 1/3, 2/3, 3/3 and the whole plan; merged, the same
    cases and statuses; `harness report --compare` reads the merged run like any other; and a missing part is named
    by `harness merge`."""
    options = {"models": "flux,qwenimage", "layouts": "single,ulysses2,tp2", "backends": "native", "dtypes": "fp32",
               "kinds": "tensor", "shapes": "default", "case_timeout": 600}
    whole = settings_for(**options, report_dir="whole")
    runner.run(whole, runner.plan_from(whole), echo=lambda _: None)
    for k in (1, 2, 3):
        part = settings_for(**options, report_dir=f"part{k}", shard=f"{k}/3")
        runner.run(part, runner.plan_from(part), echo=lambda _: None)

    merge = [sys.executable, "-m", "harness", "merge", "part1", "part2", "part3", "--report-dir", "merged"]
    done = subprocess.run(merge, cwd=project, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    read = {name: json.loads((project / name / "results.json").read_text())["cases"] for name in ("whole", "merged")}
    assert [(c["case_id"], c["status"]) for c in read["merged"]] == [(c["case_id"], c["status"]) for c in read["whole"]]
    assert {c["status"] for c in read["whole"]} >= {"PASS"}

    compare = subprocess.run([sys.executable, "-m", "harness", "report", "--compare", "whole", "merged"], cwd=project,
                             capture_output=True, text=True, timeout=900)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    assert "compare: 0 changed status (0 regressions), 0 only in NEW, 0 only in OLD" in compare.stdout

    missing = subprocess.run(merge[:4] + ["part1", "part3", "--report-dir", "merged2"], cwd=project,
                             capture_output=True, text=True, timeout=900)
    assert missing.returncode == 2
    lacking = [c["case_id"] for c in json.loads((project / "part2/results.json").read_text())["cases"]]
    assert f"part 2/3 is missing (no folder given holds it): {len(lacking)} planned case(s): " in missing.stderr
    assert describe(lacking) in missing.stderr
