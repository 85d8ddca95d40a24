"""Object-store storage, the data side: the data step's listing (same check and digest as a sync,
nothing downloaded) against the test S3 server, and the nodes' stager refusing data that changed
since the listing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from components.s3_sync import sync
from components.s3_sync.staging import DataChanged, stage
from pipelines.dataset import (
    SPLITS,
    DatasetLayoutError,
    folder_layout,
    inspect_dataset,
    listing_layout,
    stage_dataset,
)
from tests.image_data import write_image_folder
from tests.pipelines.conftest import upload_folder
from trainer.data import load_image
from trainer.listing import scan_split

REPO = Path(__file__).resolve().parents[2]


def upload(s3, folder: Path, name: str) -> str:
    return upload_folder(s3, folder, "object-store-data", name)


# -- the layout from a listing is the layout of the folder ---------------------------------------


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"val_per_class": None},  # no val/
        {"classes": ("only",)},
    ],
)
def test_a_listing_reads_like_its_folder(tmp_path: Path, layout):
    folder = write_image_folder(tmp_path / "data", per_class=2, **layout)
    (folder / "train" / "notes.txt").write_text("not an image")
    (folder / "README").write_text("top-level file")
    keys = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    assert listing_layout(keys) == folder_layout(folder)


def test_empty_class_folders_and_foreign_val_classes_are_named():
    empty = listing_layout(["train/a/1.png", "train/b/notes.txt", "val/a/2.png"])
    with pytest.raises(DatasetLayoutError, match=r"class folders without images: \['b'\]"):
        empty.check("s3://b/d")
    foreign = listing_layout(["train/a/1.png", "val/a/2.png", "val/z/3.png"])
    with pytest.raises(DatasetLayoutError, match=r"val/ has classes that train/ lacks: \['z'\]"):
        foreign.check("s3://b/d")
    nothing = listing_layout([])
    with pytest.raises(DatasetLayoutError, match="has no train/ folder"):
        nothing.check("s3://b/d")


@pytest.mark.parametrize(
    ("tops", "hint"),
    [
        (("train", "valid", "test"), "; rename 'valid' to val/ (images kept out of the training)"),
        (("train", "test"), "; rename 'test' to val/ (images kept out of the training)"),
        (("Train", "val"), "; rename 'Train' to train/: the pipeline reads these names"),
        (
            ("Train", "Validation"),  # both at once, not one refusal after the other
            "; rename 'Train' to train/ and 'Validation' to val/ (images kept out of the "
            "training): the pipeline reads these names",
        ),
    ],
)
def test_a_split_under_another_name_is_named_with_the_rename(tops, hint):
    """Kaggle's train/valid/test, CIFAR's train/test: refused ("has no val/ folder (it has
    [...])"), now with the folder that would do."""
    layout = listing_layout([f"{top}/{c}/1.png" for top in tops for c in ("a", "b")])
    with pytest.raises(DatasetLayoutError) as refused:
        layout.check("s3://b/d")
    assert hint in str(refused.value)


def _refusal(folder: Path, data_uri: str) -> str:
    """Why the data step refuses ``folder``: the same read from its files (a local folder) as
    from an S3 listing of them."""
    keys = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    said = []
    for layout in (listing_layout(keys), folder_layout(folder)):
        with pytest.raises(DatasetLayoutError) as refused:
            layout.check(data_uri)
        said.append(str(refused.value))
    assert said[0] == said[1]
    return said[0]


def test_class_folders_one_level_down_without_a_split_are_named(tmp_path: Path):
    """Food-101 as published: images/<class>/*.jpg beside meta/ (its own split lists)."""
    folder = tmp_path / "food-101"
    write_image_folder(folder / "images", per_class=1, val_per_class=None)
    (folder / "images" / "train").rename(folder / "images" / "all")
    for name in ("circle", "square"):
        (folder / "images" / "all" / name).rename(folder / "images" / name)
    (folder / "images" / "all").rename(folder / "meta")
    assert _refusal(folder, "s3://b/food").endswith(
        "; 'images' holds class folders of images without a train/val split: move each to "
        "s3://b/food/train/<class>/ and some of each class's images (one in five, say) to "
        "s3://b/food/val/<class>/"
    )


def test_a_data_set_uploaded_as_an_archive_is_named_as_one():
    layout = listing_layout(["flowers.zip", "README.md"])
    with pytest.raises(DatasetLayoutError) as refused:
        layout.check("s3://b/d")
    assert "has no train/ folder (it has no folders, only the files 'README.md', 'flow" in str(
        refused.value
    )
    assert str(refused.value).endswith(
        "; 'flowers.zip' is an archive, which the pipeline does not unpack: unpack it and upload "
        "its train/ and val/ folders under s3://b/d/"
    )


def test_a_data_uri_one_folder_too_high_is_named_with_the_one_below(tmp_path: Path):
    folder = tmp_path / "bucket"
    write_image_folder(folder / "flowers", per_class=1, val_per_class=1)
    assert _refusal(folder, "s3://b/d").endswith(
        "; 'flowers' holds the splits itself: set data_uri to s3://b/d/flowers"
    )


def test_training_classes_without_val_images_are_named_before_the_training():
    """Allowed (the validation and the evaluation score the other classes, by name), but said
    in the data step's report; a listing and a folder say the same."""
    keys = ["train/ant/1.png", "train/bee/2.png", "train/cat/3.png", "val/bee/4.png"]
    layout = listing_layout(keys)
    assert layout.check("s3://b/d") == 3
    (note,) = layout.notes()
    assert note.startswith(
        "val/ has no images of 2 of the 3 training classes ('ant', 'cat'): the validation and "
        "the evaluation gate score the model on the others"
    )
    assert listing_layout([*keys, "val/ant/5.png", "val/cat/6.png"]).notes() == []


def test_the_data_step_and_the_trainer_count_the_same_files_as_images(tmp_path: Path):
    """One list (kfp_ddp.image_files), torchvision's ImageFolder's and GIF: a grey .pgm data
    set (an ImageFolder of torchvision's) trains, a .heic is skipped and named by both."""
    folder = tmp_path / "data" / "train" / "faces"
    folder.mkdir(parents=True)
    grey = Image.new("L", (12, 10), 90)
    for suffix in (".png", ".JPG", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".TIFF", ".ppm"):
        grey.convert("RGB").save(folder / f"a{suffix}")
    grey.save(folder / "s1.pgm")
    (folder / "IMG_0001.heic").write_bytes(b"\0\0\0\x18ftypheic")
    layout = folder_layout(tmp_path / "data")
    listing = scan_split(tmp_path / "data" / "train")
    assert layout.splits["train"]["faces"] == len(listing) == 10
    assert layout.unused == ["train/faces/IMG_0001.heic"]
    pgm = next(listing.path(i) for i in range(len(listing)) if listing.path(i).endswith(".pgm"))
    assert load_image(pgm).mode == "RGB"


def test_images_in_a_class_folders_sub_folders_are_the_classs(tmp_path: Path):
    """As torchvision's ImageFolder reads them: Tiny ImageNet keeps each class's images in
    train/<class>/images/ beside a boxes.txt. Such a data set was refused ("class folders without
    images"); its images now train, in the data step's counts and the trainer's listing alike,
    and what is not an image, or sits in a hidden folder, is named as skipped."""
    folder = tmp_path / "tiny"
    for split in ("train", "val"):
        for name in ("n01443537", "n01629819"):
            images = folder / split / name / "images"
            images.mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(images / f"{name}_{i}.JPEG")
            (folder / split / name / f"{name}_boxes.txt").write_text("0 0 8 8")
    hidden = folder / "train" / "n01443537" / ".ipynb_checkpoints"
    hidden.mkdir()
    Image.new("RGB", (8, 8)).save(hidden / "copy.png")  # a notebook's copy: not training data
    (folder / "train" / "n01629819" / "images" / "again").symlink_to("..")  # a loop, read once

    layout = folder_layout(folder)
    keys = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    assert listing_layout(keys) == layout  # an S3 listing of the same files says the same
    assert layout.check("s3://b/tiny") == 2
    assert layout.images() == {split: {"n01443537": 3, "n01629819": 3} for split in SPLITS}
    assert "train/n01443537/.ipynb_checkpoints/copy.png" in layout.unused
    assert "train/n01443537/n01443537_boxes.txt" in layout.unused
    listing = scan_split(folder / "train")
    assert len(listing) == 6 and listing.name(0) == "images/n01443537_0.JPEG"
    assert all(Path(listing.path(i)).is_file() for i in range(len(listing)))


# -- against the test S3 server -------------------------------------------------------------------


def test_the_listing_has_the_digest_a_sync_finds_and_downloads_nothing(s3, tmp_path: Path):
    uri = upload(s3, write_image_folder(tmp_path / "data", per_class=3), "cats")
    listed = inspect_dataset(uri)
    assert listed.files == 3 * (3 + 4) and listed.classes == 3
    staged = stage_dataset(uri, tmp_path / "ws")  # the shared-volume data step, for comparison
    assert listed.digest == staged.digest
    assert listed.metadata()["digest"] == staged.digest


def test_a_bad_layout_fails_the_listing_naming_the_uri(s3, tmp_path: Path):
    uri = upload(s3, write_image_folder(tmp_path / "data", val_per_class=None), "no-val")
    with pytest.raises(DatasetLayoutError, match=f"data_uri='{uri}': has no val/ folder"):
        inspect_dataset(uri)


CAFE_NFC, CAFE_NFD = "caf\u00e9", "cafe\u0301"  # 'café' composed (Linux) and decomposed (macOS)


def test_a_class_uploaded_from_a_mac_is_the_class_it_reads_as(s3, tmp_path: Path):
    """val/ uploaded from a Mac (S3 keys in NFD) of a class whose train/ came from Linux (NFC) is
    that class; one split holding both spellings is refused, naming both."""
    folder = write_image_folder(tmp_path / "data", classes=(CAFE_NFC, "tea"), per_class=2)
    (folder / "val" / CAFE_NFC).rename(folder / "val" / CAFE_NFD)
    listed = inspect_dataset(upload(s3, folder, "mac-val"))
    assert listed.classes == 2 and not listed.notes  # no class unscored, nothing refused

    (folder / "train" / CAFE_NFD).mkdir()
    (folder / "train" / CAFE_NFD / "x.png").write_bytes(next(folder.rglob("*.png")).read_bytes())
    with pytest.raises(DatasetLayoutError) as refused:
        inspect_dataset(upload(s3, folder, "both-spellings"))
    assert f"train/: class folders {CAFE_NFD!r} (NFD) and {CAFE_NFC!r} (NFC) are one name " in str(
        refused.value
    )


def test_data_that_changed_since_the_listing_is_not_staged(s3, tmp_path: Path):
    folder = write_image_folder(tmp_path / "data", per_class=3)
    uri = upload(s3, folder, "changing")
    listed = inspect_dataset(uri)
    source = next((folder / "train" / "circle").iterdir())
    (folder / "train" / "circle" / "extra.png").write_bytes(source.read_bytes())
    sync(str(folder), uri)  # someone writes into the data set while the run goes on
    root = tmp_path / "node-disk"
    with pytest.raises(DataChanged, match="changed since the pipeline listed it"):
        stage(uri, root, expect_digest=listed.digest)
    assert {p.name for p in root.glob("*/*")} <= {"mirror", ".lock"}  # nothing frozen
    # The node's stager exits 2 (permanent: a restart would find the same data) and runs nothing.
    marker = tmp_path / "trained"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.s3_sync.stage",
            *("--source", uri, "--root", str(root), "--expect-digest", listed.digest),
            *("--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "changed since the pipeline listed it" in result.stderr and not marker.exists()
    # The digest of what is there now stages fine.
    assert stage(uri, root, expect_digest=inspect_dataset(uri).digest).snapshot.is_dir()


def test_what_lies_beside_the_splits_is_named_with_what_it_costs(tmp_path: Path):
    """Kaggle's and ImageNet's unlabeled test/ (100,000 images for ImageNet), a README, a Mac
    zip's __MACOSX/: the data step said nothing of them, and every node's staging downloaded
    them for a training that never reads them."""
    folder = write_image_folder(tmp_path / "dogs", per_class=1, val_per_class=1)
    (folder / "test").mkdir()
    for index in range(3):
        (folder / "test" / f"{index}.png").write_bytes(b"unlabeled")
    (folder / "__MACOSX" / "train").mkdir(parents=True)
    (folder / "__MACOSX" / "train" / "._0.png").write_bytes(b"AppleDouble")
    (folder / "README.md").write_text("the data set")
    (folder / ".DS_Store").write_bytes(b"hidden: not named")
    keys = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    expected = (
        "5 file(s) beside train/ and val/ are not trained on, but every staging of the data set "
        "downloads them: README.md, __MACOSX/ (1 file), test/ (3 files); keep only train/ and "
        "val/ under the data set's prefix to save that"
    )
    for layout in (folder_layout(folder), listing_layout(keys)):  # a folder, an S3 listing
        assert layout.check("s3://b/dogs") == 3
        assert expected in layout.notes()
    (folder / "test").rename(tmp_path / "test")
    (folder / "__MACOSX").rename(tmp_path / "__MACOSX")
    (folder / "README.md").unlink()
    assert not any("beside train/" in note for note in folder_layout(folder).notes())
