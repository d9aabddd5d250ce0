"""Can a picture tell a broken context-parallel layout from a correct one? Measures it on the tiny pipelines.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 benchmarks/image_separation.py [--models flux,wan]
        [--layouts ulysses2:native,ring2:_native_flash] [--png DIR] [--json FILE]

Every rank builds each model's pipeline (fp32 and bf16) and runs it under ulysses2 (native backend) and ring2
(_native_flash, CPU shim), both correct and with the `cp_local_attention` fault (`tp_skip_allreduce` for TP
layouts); rank 0 also runs it single-process (the references) and prints, per model and dtype, SSIM / PSNR / max /
mean pixel error against the fp32 reference and, for bf16, against the bf16 single-process image, then whether
the `[tool.harness.image]` limits pass every correct run and fail every broken one. Run without torchrun it prints
the single-process rows only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from harness import faults
from harness.catalogue.pipelines import MODELS, build_pipeline, run_pipeline, transformer_of
from harness.core import determinism
from harness.core.layouts import parse_layout
from harness.rank import backends, cpu
from harness.rank.image_metrics import diff_image, image_metrics, scalar_metrics, to_png, violations
from harness.run.settings import load_settings

THRESHOLDS = load_settings().image  # the limits the verdict applies ([tool.harness.image] over the defaults)

DEFAULT_LAYOUTS = "ulysses2:native,ring2:_native_flash"
# The negative control of each kind of layout (see harness/faults/).
FAULT = {"cp": "cp_local_attention", "tp": "tp_skip_allreduce"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def run_once(model: str, dtype: torch.dtype, backend: str = "native", config=None, fault: str | None = None):
    """A fresh pipeline, optionally parallel (with the fault active around `enable_parallelism` and the call)."""
    pipe = build_pipeline(model, dtype)
    transformer = transformer_of(pipe)
    try:
        transformer.set_attention_backend(backend)
        with faults.active(fault):
            if config is not None:
                transformer.enable_parallelism(config=config)
            started = time.perf_counter()
            image = run_pipeline(pipe, model)
        return image, time.perf_counter() - started
    finally:
        backends.reset_active_backend()


class Bench:
    """Runs one model x dtype on every rank; rank 0 keeps the references and the rows of the table."""

    def __init__(self, rank: int, world_size: int, layouts: str, png: Path | None):
        self.rank, self.world_size, self.png = rank, world_size, png
        self.layouts = [tuple(item.split(":")) for item in layouts.split(",")]
        self.meshes: dict[str, object] = {}
        self.rows: list[dict] = []

    def mesh(self, layout):
        if layout.name not in self.meshes:
            from torch.distributed.device_mesh import init_device_mesh

            shape, names = layout.mesh_spec()
            self.meshes[layout.name] = init_device_mesh("cpu", shape, mesh_dim_names=names)
        return self.meshes[layout.name]

    def references(self, model: str) -> dict:
        """Single-process images (rank 0 only): fp32, bf16, and an fp32 rerun that must be bit-identical."""
        refs, seconds = {}, {}
        for name, dtype in DTYPES.items():
            refs[name], seconds[name] = run_once(model, dtype)
        rerun, _ = run_once(model, torch.float32)
        assert np.array_equal(rerun, refs["fp32"]), f"{model}: fp32 single-process run is not deterministic"
        self.add(model, "bf16", "single", None, refs["bf16"], refs, seconds["bf16"])
        self.add(model, "fp32", "single", None, refs["fp32"], refs, seconds["fp32"])
        return refs

    def add(self, model, dtype, layout, fault, image, refs, seconds) -> None:
        row = {"model": model, "dtype": dtype, "layout": layout, "fault": fault or "-", "seconds": seconds}
        if isinstance(image, str):
            self.rows.append({**row, "error": image})
            return
        row.update(std=float(np.std(image)), vs_ref=scalar_metrics(image_metrics(image, refs["fp32"])))
        if dtype != "fp32":
            row["vs_base"] = scalar_metrics(image_metrics(image, refs[dtype]))
        row["violations"] = [v for key in ("vs_ref", "vs_base") if key in row
                             for v in violations(row[key], THRESHOLDS[dtype])]
        self.rows.append(row)
        if self.png is not None:
            stem = f"{model}-{dtype}-{layout}-{fault or 'clean'}"
            to_png(image, self.png / f"{stem}.png")
            to_png(diff_image(image, refs["fp32"], gain=4.0), self.png / f"{stem}-diff.png")

    def parallel(self, model: str, dtype: str, refs: dict | None) -> None:
        """Every layout x fault on all ranks; rank 0 measures against the references."""
        for layout_name, backend in self.layouts:
            layout = parse_layout(layout_name)
            if layout.world_size != self.world_size:
                continue
            for fault in (None, FAULT["tp" if layout.tp > 1 else "cp"]):
                config = layout.diffusers_config(mesh=self.mesh(layout))
                try:
                    image, seconds = run_once(model, DTYPES[dtype], backend, config, fault)
                except Exception as error:  # noqa: BLE001 - e.g. a model without a TP plan: a row, not a crash
                    image, seconds = backends.first_line(error), 0.0
                if self.rank == 0:
                    self.add(model, dtype, layout_name, fault, image, refs, seconds)
                dist.barrier()


def fmt(metrics: dict | None) -> str:
    if metrics is None:
        return " " * 37
    return "{ssim:8.5f} {psnr:7.1f} {max_abs_err:9.2e} {mean_abs_err:9.2e}".format(**metrics)


def print_table(rows: list[dict]) -> None:
    head = f"{'SSIM':>8} {'PSNR':>7} {'max err':>9} {'mean err':>9}"
    print(f"\n{'model':<10}{'dtype':<6}{'layout':<15}{'fault':<19}{'run s':>6}  | vs fp32 reference"
          f"{'':<20}| vs same-dtype single-process")
    print(f"{'':<56}| {head} | {head}")
    for row in rows:
        results = f"ERROR {row['error']}" if "error" in row else f"{fmt(row['vs_ref'])} | {fmt(row.get('vs_base'))}"
        print(f"{row['model']:<10}{row['dtype']:<6}{row['layout']:<15}{row['fault']:<19}{row['seconds']:6.2f}  | "
              f"{results}")


def print_separation(rows: list[dict]) -> None:
    """Whether the limits pass every correct run and fail every broken one."""
    measured = [row for row in rows if "error" not in row]
    wrong = [row for row in measured if bool(row["violations"]) != (row["fault"] != "-")]
    print(f"\nthresholds {THRESHOLDS}")
    print(f"{len(measured) - len(wrong)}/{len(measured)} runs judged right (correct pass, broken fail)")
    for row in wrong:
        print(f"  WRONG: {row['model']} {row['dtype']} {row['layout']} {row['fault']}: {row['violations']}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, default: all")
    parser.add_argument("--layouts", default=DEFAULT_LAYOUTS,
                        help=f"layout:backend pairs; those of the launch's world size run (default {DEFAULT_LAYOUTS})")
    parser.add_argument("--png", type=Path, help="write every image and its x4 difference to this folder")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    determinism.quiet_diffusers()
    determinism.strict_fp32()
    cpu.apply()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    bench = Bench(rank, world_size, args.layouts, args.png)
    try:
        for model in args.models.split(","):
            refs = bench.references(model) if rank == 0 else None
            for dtype in DTYPES if distributed else ():
                bench.parallel(model, dtype, refs)
    finally:
        if distributed:
            dist.destroy_process_group()
    if rank == 0:
        print_table(bench.rows)
        print_separation(bench.rows)
        if args.json:
            args.json.write_text(json.dumps(bench.rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
