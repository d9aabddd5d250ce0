"""prune_images: a failing image case keeps its four PNGs, any other case small shared previews of its reference,
candidate and difference, drawn as an images block with a note."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.core.results import CaseResult, Status
from harness.report.images import NOTE, PREVIEW_BOX, PREVIEW_ROLES, prune_images

NAMES = ("reference", "candidate", "diff", "ssim_map")
SHRUNK = NOTE.format(size="Shrunk from 64 \u00d7 64 to 32 \u00d7 32 pixels (each side divided by 2)")


def _case(images_dir: Path, status: Status, case_id: str = "flux/ulysses2/native/fp32/image",
          size: tuple[int, int] = (64, 64), colour: tuple[int, int, int] = (200, 40, 90),
          names: tuple[str, ...] = NAMES) -> CaseResult:
    """An image case as the worker leaves it: its PNGs named after the case, paths relative to the report."""
    images_dir.mkdir(parents=True, exist_ok=True)
    slug = case_id.replace("/", "_")
    paths = {}
    for name in names:
        pixels = np.zeros((size[1], size[0], 3), dtype=np.uint8)
        pixels[...] = {"candidate": colour, "baseline": (90, 90, 200)}.get(name, (10, 10, 10))
        pixels[: size[1] // 2, : size[0] // 2] = (255, 255, 255)  # some structure, so resizing has work to do
        Image.fromarray(pixels).save(images_dir / f"{slug}-{name}.png")
        paths[name] = f"{images_dir.name}/{slug}-{name}.png"
    model, layout, backend, dtype, kind = case_id.split("/")
    return CaseResult(case_id, model, "default", kind, layout, 2, backend, dtype, status,
                      extra={"images": paths, "baseline": {"ssim": 0.99}})


def _files(images_dir: Path) -> list[str]:
    return sorted(path.name for path in images_dir.iterdir())


def _pixels(images_dir: Path, path: str) -> np.ndarray:
    with Image.open(images_dir / Path(path).name) as picture:
        return np.asarray(picture.convert("RGB"))


@pytest.mark.parametrize("status", [Status.FAIL, Status.ERROR, Status.TIMEOUT])
def test_failing_cases_keep_all_four(tmp_path, status):
    images = tmp_path / "images"
    case = _case(images, status)
    before = dict(case.extra["images"])
    prune_images(case, images, "failing")
    assert case.extra["images"] == before and "blocks" not in case.extra
    assert len(_files(images)) == 4


@pytest.mark.parametrize("status", [Status.PASS, Status.XFAIL, Status.SKIP])
def test_other_cases_keep_previews_of_reference_candidate_and_difference(tmp_path, status):
    """The three pictures a reviewer compares, each at most PREVIEW_BOX (a 64x64 picture at 32x32), as an images
    block whose note says so; the SSIM map and the whole pictures go, and nothing else in extra changes."""
    images = tmp_path / "images"
    case = _case(images, status)
    prune_images(case, images)  # "failing" is the default policy
    (block,) = case.extra["blocks"]
    assert block["type"] == "images" and block["note"] == SHRUNK and "images" not in case.extra
    assert list(block["images"]) == ["reference", "candidate", "diff"]
    assert case.extra["baseline"] == {"ssim": 0.99}
    assert sorted({Path(path).name for path in block["images"].values()}) == _files(images)
    for role, path in block["images"].items():
        assert path.startswith("images/preview-") and _pixels(images, path).shape == (32, 32, 3), role
    assert tuple(_pixels(images, block["images"]["candidate"])[24, 24]) == (200, 40, 90)  # the candidate's picture
    assert tuple(_pixels(images, block["images"]["reference"])[24, 24]) == (10, 10, 10)


def test_low_precision_keeps_the_picture_its_parity_check_compares_with(tmp_path):
    """A bf16 case's own single-device picture (`baseline`) is kept beside the fp32 reference, in PREVIEW_ROLES'
    order; the fp32 case above, which has none, is the control."""
    images = tmp_path / "images"
    case = _case(images, Status.PASS, "flux/ulysses2/native/bf16/image", names=("baseline", *NAMES))
    prune_images(case, images)
    shown = case.extra["blocks"][0]["images"]
    assert list(shown) == list(PREVIEW_ROLES) == ["reference", "baseline", "candidate", "diff"]
    assert tuple(_pixels(images, shown["baseline"])[24, 24]) == (90, 90, 200)


def test_the_note_says_the_sizes_it_kept(tmp_path):
    """A picture that fits the box is kept at its size, and the note says so rather than "shrunk"."""
    images = tmp_path / "images"
    tiny = _case(images, Status.PASS, "flux/ring2/native/fp32/image", size=(16, 16))
    prune_images(tiny, images)
    assert tiny.extra["blocks"][0]["note"] == NOTE.format(size="Kept at their own 16 \u00d7 16 pixels")


def test_the_difference_keeps_each_block_brightest_pixel(tmp_path):
    """A difference of one bright pixel stays that bright when shrunk (each block's largest value, not its mean,
    which would dim it to a quarter); the candidate, shrunk by its mean, is the control."""
    images = tmp_path / "images"
    case = _case(images, Status.PASS)
    for name in ("diff", "candidate"):
        pixels = np.zeros((64, 64, 3), dtype=np.uint8)
        pixels[9, 9] = (255, 200, 100)
        Image.fromarray(pixels).save(images / Path(case.extra["images"][name]).name)
    prune_images(case, images)
    shown = case.extra["blocks"][0]["images"]
    assert tuple(_pixels(images, shown["diff"])[4, 4]) == (255, 200, 100)
    assert _pixels(images, shown["diff"]).sum() == 255 + 200 + 100  # nothing else lit
    assert _pixels(images, shown["candidate"]).max() < 200


def test_identical_pictures_share_one_file(tmp_path):
    """fp32 pictures of a correct layout are the same pixels in every layout and backend, and their reference is
    one per model: the previews of many cases are a few files."""
    images = tmp_path / "images"
    first = _case(images, Status.PASS, "flux/ulysses2/native/fp32/image")
    second = _case(images, Status.PASS, "flux/ring2/native/fp32/image")
    other = _case(images, Status.PASS, "flux/ring4/native/bf16/image", colour=(30, 200, 30))
    for case in (first, second, other):
        prune_images(case, images)
    shown = [case.extra["blocks"][0]["images"] for case in (first, second, other)]
    assert shown[0] == shown[1] and shown[0]["candidate"] != shown[2]["candidate"]
    assert shown[0]["reference"] == shown[2]["reference"] and shown[0]["diff"] == shown[2]["diff"]
    assert len(_files(images)) == 4  # one reference, one difference, two candidates


def test_a_preview_fits_the_box_and_keeps_the_aspect(tmp_path):
    images = tmp_path / "images"
    video = _case(images, Status.PASS, "wan/ring2/native/fp32/image", size=(320, 64))  # 5 frames side by side
    tiny = _case(images, Status.PASS, "flux/ring2/native/fp32/image", size=(16, 16), colour=(1, 2, 3))
    prune_images(video, images)
    prune_images(tiny, images)
    for role, path in video.extra["blocks"][0]["images"].items():
        height, width, _ = _pixels(images, path).shape
        assert width <= PREVIEW_BOX[0] and height <= PREVIEW_BOX[1] and abs(width / height - 5) < 0.3, role
    for role, path in tiny.extra["blocks"][0]["images"].items():
        assert _pixels(images, path).shape == (16, 16, 3), role  # never enlarged


def test_policy_all_keeps_everything(tmp_path):
    images = tmp_path / "images"
    case = _case(images, Status.PASS)
    before = dict(case.extra["images"])
    prune_images(case, images, "all")
    assert case.extra["images"] == before and len(_files(images)) == 4


def test_missing_candidate_or_no_images(tmp_path):
    images = tmp_path / "images"
    case = _case(images, Status.PASS)
    (images / Path(case.extra["images"]["candidate"]).name).unlink()
    prune_images(case, images)
    assert "images" not in case.extra and "blocks" not in case.extra and _files(images) == []
    plain = CaseResult("flux/ring2/native/fp32/tensor", "flux", "default", "tensor", "ring2", 2, "native", "fp32",
                       Status.PASS, extra={"abs_err_hist": {}})
    prune_images(plain, images)
    assert plain.extra == {"abs_err_hist": {}}


def test_unknown_policy_is_refused(tmp_path):
    case = _case(tmp_path / "images", Status.PASS)
    with pytest.raises(ValueError, match="images policy 'some'"):
        prune_images(case, tmp_path / "images", "some")


def test_an_images_block_is_pruned_like_the_images_key(tmp_path):
    """Pictures given as a detail block (harness.core.figures.images, with captions) are pruned the same way: a
    passing case keeps the previews in its block, the captions stay and the note is added; a failing one keeps its
    block as it was; a block whose candidate is gone goes, the other blocks stay."""
    from harness.core.figures import histogram, images

    folder = tmp_path / "images"
    passing, failing, lost = (_case(folder, status, f"flux/{layout}/native/fp32/image") for status, layout in
                              ((Status.PASS, "ring2"), (Status.FAIL, "ring4"), (Status.PASS, "tp2")))
    for case in (passing, failing, lost):
        case.extra["blocks"] = [images("Images", case.extra.pop("images"), {"reference": "the reference"}),
                                histogram("h", [0, 1], [1])]
    before = [dict(block) for block in failing.extra["blocks"]]
    (folder / Path(lost.extra["blocks"][0]["images"]["candidate"]).name).unlink()
    for case in (passing, failing, lost):
        prune_images(case, folder)
    block = passing.extra["blocks"][0]
    assert list(block["images"]) == ["reference", "candidate", "diff"] and block["note"] == SHRUNK
    assert block["captions"] == {"reference": "the reference"}
    assert failing.extra["blocks"] == before
    assert [b["type"] for b in lost.extra["blocks"]] == ["histogram"]
    assert len([name for name in _files(folder) if name.startswith("preview-")]) == 3
