"""Plan every part on the GPU machine and capture the references they need, before any part runs.

Exactly the references `harness run` would capture for the cases of each part that run on this machine (the
harness's own `ensure_references`), so the parts find them all and none is made twice; each is fp32 with TF32 off
(the harness's `strict_fp32`) and with PyTorch's deterministic algorithms on where it has them. The harness's
`capture` of every kind computes on the CPU (a reference is the single-device CPU truth that every device is compared
with), so on a GPU machine these are that machine's CPU references, made with its own torch and diffusers: a GPU
`single` case is then the cross-device comparison.

It also writes OUT/plan.json: each part's command line, its case counts on this machine and the estimate from them
(benchmarks/gpu/plan.py), which the check puts beside the part's measured seconds.

    python benchmarks/gpu/capture.py --out DIR --gpus N
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before torch: cuBLAS reads it at its first use

import plan  # noqa: E402  (puts the checkout on sys.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="capture.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", type=int, required=True)
    args = parser.parse_args(argv)

    import torch

    from harness.run.capture import ensure_references

    torch.use_deterministic_algorithms(True, warn_only=True)
    started, rows = time.monotonic(), []
    for planned in plan.plan_parts(args.out, args.gpus, None):  # this machine's own plan of each part
        cases = [p.case for p, view in planned.views if view.status == "RUN"]
        metas = ensure_references(cases, planned.settings.path("references"), print, True, planned.settings)
        print(f"{planned.part.name}: {len(metas)} reference(s) ready for {len(cases)} case(s)")
        rows.append({"name": planned.part.name, "title": planned.part.title, "cap_s": planned.part.cap_s,
                     "args": planned.args, "counts": dict(planned.counts()), "estimate": planned.estimate})
    (args.out / "plan.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"references: {args.out / 'references'} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
