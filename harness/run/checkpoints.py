"""The checkpoint folders the checkpoint loads read (harness.loads), written once per run by the parent.

Every rank of every launch loads from the same folders with `from_pretrained`, so they are written here, before the
first launch, in the run's work files (`<report_dir>.work/launches/checkpoints`, emptied with them when a run
starts): one per reference a planned case loads from, the reference's own weights as diffusers' `save_pretrained`
writes them (safetensors, sharded across several files with an index, harness.rank.loading.MAX_SHARD_SIZE), never
per case.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from harness.core.reference import read_reference, reference_path
from harness.kinds import kind_of
from harness.loads import load_of
from harness.rank import loading

FOLDER = "checkpoints"


def write_checkpoints(cases, references: Path, workdir: Path, echo: Callable[[str], None]) -> Path | None:
    """The folder of this run's checkpoints (None when no case loads from one), each written once."""
    wanted = {(case.model, case.shape, case.kind): case for case in cases if load_of(case.load).checkpoint}
    if not wanted:
        return None
    root, started = Path(workdir) / FOLDER, time.monotonic()
    for (model, shape, kind), case in sorted(wanted.items()):
        target = loading.folder(root, model, shape, kind)
        if target.exists():
            continue
        reference = read_reference(reference_path(references, model, shape, kind), kind_of(kind).reference_hash(case))
        partial = target.with_name(target.name + ".partial")
        kind_of(kind).save_checkpoint(case, reference, partial)
        partial.replace(target)  # whole or absent: a rank never reads a half-written folder
    files = sum(1 for _ in root.rglob("*.safetensors"))
    echo(f"checkpoints: {len(wanted)} folder(s), {files} safetensors file(s), saved in "
         f"{time.monotonic() - started:.1f}s for the from_pretrained loads ({root})")
    return root
