"""Which PNGs of an image case stay in `reports/images/`: all four for a case that failed, one thumbnail otherwise.

The worker writes reference, candidate, 10x difference and SSIM-map PNGs for every image case; on the full plan
that is thousands of files nobody opens for a passing case. After a case is judged, `prune_images` keeps them all
when the case failed (FAIL, ERROR, TIMEOUT) or the policy is "all"; otherwise it keeps one small thumbnail of the
candidate and deletes the rest, and rewrites `extra["images"]` to say what is left.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path, PurePosixPath

from harness.core.results import CaseResult

POLICIES = ("failing", "all")  # the `images` option's values (harness.run.settings)
THUMB_BOX = (96, 32)  # most width, height of a thumbnail: a 64x64 picture -> 32x32, a 5-frame strip -> 96x19


def prune_images(result: CaseResult, images_dir: Path, policy: str = "failing") -> None:
    """Keep every PNG of a failing case (or with policy "all"); for any other case replace them by one thumbnail.

    The pictures are `extra["images"]` and the `images` of each images block (harness.core.figures.images). The
    thumbnail is the candidate shrunk to fit THUMB_BOX, named after its content (`thumb-<hash>.png`), so the
    identical pictures of many passing cases share one file. A case without recorded images, or whose candidate
    PNG is missing, keeps no image at all (and an images block that held them goes)."""
    if policy not in POLICIES:
        raise ValueError(f"images policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if policy == "all" or result.status.is_bad:
        return
    images_dir = Path(images_dir)
    blocks = result.extra.get("blocks") if isinstance(result.extra.get("blocks"), list) else []
    holders = [result.extra] + [block for block in blocks if isinstance(block, dict) and block.get("type") == "images"]
    for holder in holders:
        if isinstance(holder.get("images"), dict):
            _prune(holder, images_dir)
    if blocks:
        result.extra["blocks"] = [block for block in blocks if not (isinstance(block, dict) and block.get("type") ==
                                                                    "images" and "images" not in block)]


def _prune(holder: dict, images_dir: Path) -> None:
    """`holder["images"]` (role -> path) down to the candidate's thumbnail, or gone without a candidate."""
    files = {name: images_dir / PurePosixPath(str(path)).name for name, path in holder["images"].items()}
    candidate = files.get("candidate")
    thumb = _thumbnail(candidate, images_dir) if candidate is not None and candidate.is_file() else None
    for path in files.values():
        if path != thumb:
            path.unlink(missing_ok=True)
    if thumb is None:
        holder.pop("images")
        return
    holder["images"] = {"thumbnail": f"{images_dir.name}/{thumb.name}"}


def _thumbnail(candidate: Path, images_dir: Path) -> Path:
    """Write the shrunk candidate under a name from its pixels' hash (kept if it exists already) and return it."""
    from PIL import Image

    with Image.open(candidate) as picture:
        picture.load()
        small = picture.copy()
    small.thumbnail(THUMB_BOX, Image.Resampling.LANCZOS)  # keeps the aspect ratio and never enlarges
    buffer = io.BytesIO()
    small.save(buffer, format="PNG", optimize=True)
    data = buffer.getvalue()
    path = images_dir / f"thumb-{hashlib.sha256(data).hexdigest()[:16]}.png"
    if not path.exists():
        path.write_bytes(data)
    return path
