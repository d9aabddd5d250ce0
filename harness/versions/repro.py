"""`harness repro CASE_ID`: one standalone script (torch, diffusers and safetensors only) that reproduces a case as a
reporter would by hand: the tiny model from the reference's config and seed weights, the reference's inputs, the
single-device run, the layout under `torchrun --nproc-per-node=N`, and the comparison against the tolerance, printing
the figure the matrix shows (max abs error of a tensor case; the step-1 gradients' relative L2 error of a train
case). It reads the reference file from beside itself, else from where it was when written (or `--reference`).

The script is the case's kind's template (harness/versions/repro_scripts/) below a generated CASE dict: what the
harness knows of the case that the reference does not hold (layout, backend, dtype, the fields of the policy its kind
judges it by, the training recipe's timestep convention); a case with a flow gets the flow's own code too, and is
judged as the harness judges it, against one device making the same calls (harness.versions.repro_flow).
Supported: tensor cases on every layout; train cases on one device and on context-parallel layouts (tensor- and
data-parallel training gathers DTensors and runs FSDP in harness code). Image cases run a whole pipeline and are
not scripted.
"""

from __future__ import annotations

import pprint
import re
import shlex
from dataclasses import asdict
from pathlib import Path

from harness.core import axes
from harness.core.errors import HarnessError
from harness.core.reference import read_meta, reference_path
from harness.kinds import kind_of, repro_template
from harness.versions.cases import planned
from harness.versions.repro_flow import flow_data, flow_part

SCRIPTS = Path(__file__).with_name("repro_scripts")
MARKER = "# --- script ---\n"


def write_repro(case_id: str, out: Path | None = None, overrides: dict | None = None) -> tuple[Path, str]:
    """Write the script for `case_id` (a case of the plan); returns its path and the command that runs it."""
    from harness.run.settings import load_settings

    item = planned([case_id], overrides)[case_id]
    case = item.case
    template, refusal = repro_template(case)
    if template is None:
        raise HarnessError(f"repro: {case_id}: {refusal}")
    settings = load_settings({**(overrides or {}), "models": case.model})
    path = reference_path(settings.path("references"), case.model, case.shape, case.kind).resolve()
    meta = read_meta(path)  # exists and is a harness reference, or a clear error naming the fix
    out = Path(out or f"repro-{axes.file_stem(case_id)}.py").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(script_text(case, template, _case_data(case, settings, path, meta), out), encoding="utf-8")
    out.chmod(0o755)
    return out, run_command(out, case.world_size)


def run_command(script: Path, world_size: int, python: str | None = None) -> str:
    """How to run the script: `torchrun --standalone --nproc-per-node=N` (or the module with a given Python)."""
    where = shlex.quote(str(script))
    if world_size == 1:
        return f"{python or 'python'} {where}"
    launcher = f"{python} -m torch.distributed.run" if python else "torchrun"
    return f"{launcher} --standalone --nproc-per-node={world_size} {where}"


def _case_data(case, settings, path: Path, meta: dict) -> dict:
    layout = case.layout
    mesh = layout.mesh_spec() or ((), ())
    data = {"id": case.case_id, "model": case.model, "kind": case.kind, "backend": case.backend, "dtype": case.dtype,
            "world_size": case.world_size,
            "layout": {"name": layout.name, "ring": layout.ring, "ulysses": layout.ulysses, "tp": layout.tp,
                       "anything": layout.anything, "mesh_shape": list(mesh[0]), "mesh_names": list(mesh[1])},
            "reference": {"name": path.name, "path": str(path)},
            **asdict(kind_of(case.kind).policy(settings, case.dtype)), **_spec_data(case.model, meta),
            "load": _load_data(case.load), "flow": flow_data(case)}
    return data


def _load_data(name: str) -> dict:
    """How the script loads the model under the layout (harness.loads): `enable_parallelism`, or
    `from_pretrained` on a sharded checkpoint it saves beside itself."""
    from harness.loads import load_of
    from harness.rank.loading import MAX_SHARD_SIZE

    load = load_of(name)
    return {"name": load.name, "checkpoint": load.checkpoint, "wrapped": load.wrapped, "max_shard_size": MAX_SHARD_SIZE}


def _spec_data(model: str, meta: dict) -> dict:
    """What the model's spec adds to the reference: the training timestep convention, and the pruned context-parallel
    plan (Helios' class plan names 40 blocks; the tiny config builds fewer)."""
    from harness.catalogue.zoo import get_spec
    from harness.catalogue.zoo.helios import pruned_cp_plan

    spec = get_spec(model)
    if spec.cp_plan is not None and spec.cp_plan is not pruned_cp_plan:
        raise HarnessError(f"repro: {model}'s spec passes its own context-parallel plan, which a script cannot "
                           "express yet")
    blocks = meta["config"].get("num_layers") if spec.cp_plan is not None else None
    return {"timestep_scale": spec.timestep_scale, "timestep_keys": list(spec.timestep_keys), "cp_plan_blocks": blocks}


def script_text(case, template: str, data: dict, out: Path) -> str:
    """The generated header (what it is, how to run it, the CASE dict), then the common part and the kind's."""
    header = (f'#!/usr/bin/env python3\n"""Reproduces {case.case_id} with diffusers alone (torch, diffusers and\n'
              f"safetensors; no harness), from the harness's reference {data['reference']['name']}.\n\n"
              f"Run: {run_command(Path(out.name), case.world_size)}\n"
              f"Written by `harness repro {case.case_id}`.\n\"\"\"\n\n"
              f"CASE = {pprint.pformat(data, width=116, sort_dicts=False)}\n")
    common, kind = [(SCRIPTS / name).read_text(encoding="utf-8").split(MARKER, 1)[1]
                    for name in ("common.py", template)]
    text = header + common + flow_part(case) + kind
    return re.sub(r"  # noqa: E402.*", "", text)  # the lint notes are for the templates
