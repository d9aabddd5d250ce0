"""What the proof's recording adds to a case's own run (harness.rank.recorder): per zoo model and kind, on one
device, one thread. The case's time (and so the floor of `bench_run.py`) includes it.

    python benchmarks/bench_recorder.py [--models flux qwenimage ...] [--repeat N]

Prints a Markdown table for the docs (docs/measured.md): the plain run and the same run recorded. References must exist
(`harness capture`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def best_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["flux", "flux2", "qwenimage", "wan"])
    parser.add_argument("--kinds", nargs="+", default=["tensor", "image", "train"])
    parser.add_argument("--repeat", type=int, default=9)
    options = parser.parse_args()
    torch.set_num_threads(1)  # as on a rank (OMP_NUM_THREADS=1)

    from harness.core import determinism
    from harness.core.errors import HarnessError
    from harness.core.layouts import Layout
    from harness.core.records import Case
    from harness.engine.context import RankContext
    from harness.kinds import kind_of
    from harness.rank import backends, cpu, loading
    from harness.rank.recorder import RunRecorder

    determinism.quiet_diffusers()
    determinism.strict_fp32()
    cpu.apply()
    backends.install_dispatch_counters()
    work = RankContext("references", None, torch.device("cpu"))
    print("| model / kind | plain run | recorded run (the case's run) | recording adds |")
    print("|---|---|---|---|")
    for model in options.models:
        for kind in options.kinds:
            case = Case(model=model, layout=Layout("single"), backend="native", dtype="fp32", kind=kind)
            try:
                built = kind_of(kind).build(case, work.reference(case), work.device, loading.enabled())
            except HarnessError:  # no reference of this kind for the model (wan is not trained in the quick plan)
                continue

            def recorded(built=built):
                return built.run_recorded(RunRecorder(built.module, built.kernel_scope))

            built.run()  # warm
            plain, with_recording = best_ms(built.run, options.repeat), best_ms(recorded, options.repeat)
            print(f"| {model} / {kind} | {plain:.1f} ms | {with_recording:.1f} ms | "
                  f"{with_recording - plain:+.1f} ms ({with_recording / plain - 1:+.0%}) |")


if __name__ == "__main__":
    main()
