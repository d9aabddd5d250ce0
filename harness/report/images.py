"""Which PNGs of an image case stay in `reports/images/`: all four for a case that failed, small previews otherwise.

The worker writes reference, candidate, 10x difference and SSIM-map PNGs for every image case; on the full plan
that is thousands of files nobody opens whole for a passing case. After a case is judged, `prune_images` keeps them
all when the case failed (FAIL, ERROR, TIMEOUT) or the policy is "all"; otherwise it keeps those a reviewer
compares (pytest-mpl's summary shows them for every test): the reference, the picture the parity check compares
with where that is another one (low precision's own single-device picture), the candidate and the difference, each
shrunk to fit PREVIEW_BOX and named after its pixels, so the identical pictures of many passing cases (one reference
per model, the black difference of every exact layout) share one file. The difference is shrunk by the largest value
of each block, so a pixel that differs stays as bright as it was. What is kept becomes an images block with a note
that says so (harness.core.figures.images), which the page draws like any other.
"""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path, PurePosixPath

from harness.core.figures import images
from harness.core.results import CaseResult

POLICIES = ("failing", "all")  # the `images` option's values (harness.run.settings)
PREVIEW_BOX = (96, 32)  # most width, height of a preview: a 64x64 picture -> 32x32, a 5-frame strip -> 80x16
PREVIEW_ROLES = ("reference", "baseline", "candidate", "diff")  # kept, in this order, of a case that did not fail
BRIGHTEST = "diff"  # the role shrunk by each block's largest value rather than its mean
TITLE = "Images (previews)"
NOTE = ("{size}, as for every case that did not fail: previews no larger than " f"{PREVIEW_BOX[0]} \u00d7 "
        f"{PREVIEW_BOX[1]} pixels; the difference keeps each block's largest value, so a pixel that differs stays "
        "visible (--images all keeps every picture whole).")


def prune_images(result: CaseResult, images_dir: Path, policy: str = "failing") -> None:
    """Keep every PNG of a failing case (or with policy "all"); for any other case replace them by previews.

    The pictures are `extra["images"]` and the `images` of each images block. A holder whose candidate PNG is missing
    keeps no image at all (and an images block that held them goes); `extra["images"]` becomes an images block of its
    own, first among the case's blocks."""
    if policy not in POLICIES:
        raise ValueError(f"images policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if policy == "all" or result.status.is_bad:
        return
    images_dir = Path(images_dir)
    blocks = result.extra.get("blocks") if isinstance(result.extra.get("blocks"), list) else []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "images" and isinstance(block.get("images"), dict):
            if note := _prune(block, images_dir):
                block["note"] = note
    if isinstance(result.extra.get("images"), dict):
        own = {"images": result.extra.pop("images")}
        if note := _prune(own, images_dir):
            blocks = [{**images(TITLE, own["images"]), "note": note}, *blocks]
    kept = [block for block in blocks if not (isinstance(block, dict) and block.get("type") == "images" and
                                              "images" not in block)]
    if kept or "blocks" in result.extra:
        result.extra["blocks"] = kept


def _prune(holder: dict, images_dir: Path) -> str:
    """`holder["images"]` (role -> path) down to the previews of PREVIEW_ROLES, or gone without a candidate; the
    note that says how they were shrunk ("" when none is left)."""
    files = {role: images_dir / PurePosixPath(str(path)).name for role, path in holder["images"].items()}
    candidate = files.get("candidate")
    kept: dict[str, Path] = {}
    note = ""
    if candidate is not None and candidate.is_file():
        size = _size(candidate)
        factor = _factor(size)
        note = NOTE.format(size=_sizes(size, factor))
        kept = {role: _preview(files[role], factor, role == BRIGHTEST, images_dir) for role in PREVIEW_ROLES
                if role in files and files[role].is_file()}
    for path in files.values():
        if path not in kept.values():
            path.unlink(missing_ok=True)
    if not kept:
        holder.pop("images")
        return ""
    holder["images"] = {role: f"{images_dir.name}/{path.name}" for role, path in kept.items()}
    return note


def _size(candidate: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(candidate) as picture:
        return picture.size


def _factor(size: tuple[int, int]) -> int:
    """The whole number each side is divided by to fit PREVIEW_BOX (1: it fits; a picture is never enlarged)."""
    return max(1, math.ceil(size[0] / PREVIEW_BOX[0]), math.ceil(size[1] / PREVIEW_BOX[1]))


def _sizes(size: tuple[int, int], factor: int) -> str:
    """What the note says of the sizes: the pictures' own and their previews' (the same when they fit)."""
    width, height = size
    if factor == 1:
        return f"Kept at their own {width} \u00d7 {height} pixels"
    return (f"Shrunk from {width} \u00d7 {height} to {math.ceil(width / factor)} \u00d7 {math.ceil(height / factor)} "
            f"pixels (each side divided by {factor})")


def _preview(path: Path, factor: int, brightest: bool, images_dir: Path) -> Path:
    """Write `path` shrunk by `factor` under a name from its pixels' hash (kept if it exists already), return it."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as picture:
        picture = picture.convert("RGB")
    size = (math.ceil(picture.width / factor), math.ceil(picture.height / factor))
    if factor == 1:
        small = picture
    elif brightest:  # each block's largest value per channel; the edge padded with black (no difference)
        pixels = np.zeros((size[1] * factor, size[0] * factor, 3), dtype=np.uint8)
        pixels[: picture.height, : picture.width] = np.asarray(picture)
        small = Image.fromarray(pixels.reshape(size[1], factor, size[0], factor, 3).max(axis=(1, 3)))
    else:
        small = picture.resize(size, Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    small.save(buffer, format="PNG", optimize=True)
    data = buffer.getvalue()
    out = images_dir / f"preview-{hashlib.sha256(data).hexdigest()[:16]}.png"
    if not out.exists():
        out.write_bytes(data)
    return out
