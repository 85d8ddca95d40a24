"""The data step refuses data a classifier cannot train or be judged on — fewer than two classes,
an empty split — in both storage modes (object-store lists, shared-volume syncs), naming data_uri
and counting each split, instead of the training finding out."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.s3_sync import sync
from pipelines.dataset import DatasetLayoutError, inspect_dataset, stage_dataset
from tests.image_data import write_image_folder
from tests.pipelines.conftest import upload_folder

DATA_STEPS = {
    "object-store": lambda uri, tmp_path: inspect_dataset(uri),
    "shared-volume": lambda uri, tmp_path: stage_dataset(uri, tmp_path / "ws"),
}


def upload(s3, folder: Path, name: str) -> str:
    return upload_folder(s3, folder, "data-step-checks", name)


@pytest.mark.parametrize("storage", DATA_STEPS)
def test_one_class_is_refused_naming_data_uri_and_the_counts(s3, tmp_path: Path, storage: str):
    folder = write_image_folder(tmp_path / "data", classes=("cat",), per_class=3, val_per_class=2)
    uri = upload(s3, folder, f"one-class-{storage}")
    with pytest.raises(DatasetLayoutError) as refused:
        DATA_STEPS[storage](uri, tmp_path)
    assert refused.value.field == "data_uri" and refused.value.value == uri
    assert str(refused.value) == (
        f"data_uri={uri!r}: train/ has 1 class ['cat'] (train/: 1 class, 3 images; val/: 1 "
        "class, 2 images); a classifier needs at least 2: add a folder of images per class "
        f"under {uri}/train/ and {uri}/val/"
    )


@pytest.mark.parametrize("storage", DATA_STEPS)
def test_an_empty_split_is_refused_with_each_splits_counts(s3, tmp_path: Path, storage: str):
    folder = write_image_folder(
        tmp_path / "data", classes=("cat", "dog"), per_class=3, val_per_class=None
    )
    (folder / "val").mkdir()
    (folder / "val" / "README.txt").write_text("images to come")
    uri = upload(s3, folder, f"empty-val-{storage}")
    with pytest.raises(DatasetLayoutError) as refused:
        DATA_STEPS[storage](uri, tmp_path)
    message = str(refused.value)
    assert message.startswith(f"data_uri={uri!r}: val/ has no class folders")
    assert "(train/: 2 classes, 6 images; val/: 0 classes, 0 images)" in message
    assert f"under {uri}/val/<class>/" in message


@pytest.mark.parametrize("storage", DATA_STEPS)
def test_two_classes_pass(s3, tmp_path: Path, storage: str):
    folder = write_image_folder(tmp_path / "data", classes=("cat", "dog"), per_class=2)
    uri = upload(s3, folder, f"two-classes-{storage}")
    assert DATA_STEPS[storage](uri, tmp_path).classes == 2


@pytest.mark.parametrize("storage", DATA_STEPS)
def test_files_the_training_skips_are_counted_and_named(s3, tmp_path: Path, storage: str):
    """They were skipped without a word (256 files listed, 250 used); a hidden image (macOS's
    ``._`` AppleDouble files) was counted as an image of its class when staged."""
    folder = write_image_folder(tmp_path / "data", classes=("café", "red circle"), per_class=2)
    (folder / "train" / "café" / ".DS_Store").write_bytes(b"\x00")
    (folder / "train" / "café" / "._0.png").write_bytes(b"\x00\x05\x16\x07")  # macOS, AppleDouble
    (folder / "train" / "café" / "notes.txt").write_text("not an image")
    (folder / "train" / "red circle" / "Thumbs.db").write_bytes(b"\x00")
    (folder / "val" / "café" / ".ipynb_checkpoints").mkdir()  # a hidden folder's image
    (folder / "val" / "café" / ".ipynb_checkpoints" / "x.jpg").write_bytes(b"\xff\xd8")
    uri = upload(s3, folder, f"clutter-{storage}")
    found = DATA_STEPS[storage](uri, tmp_path)
    assert found.unused == [
        "train/café/.DS_Store",
        "train/café/._0.png",
        "train/café/notes.txt",
        "train/red circle/Thumbs.db",
        "val/café/.ipynb_checkpoints/x.jpg",
    ]
    lines = found.report_lines()
    assert lines[0].startswith("images per class: train/ café 2, red circle 2; val/ café ")
    assert lines[1].startswith("5 file(s) are not images in a class folder and will be skipped")
    assert found.metadata()["unused_files"] == 5
    assert found.metadata()["images"]["train"] == {"café": 2, "red circle": 2}


@pytest.mark.parametrize("storage", DATA_STEPS)
def test_a_key_no_node_can_write_is_named_and_skipped_before_training(
    moto_env, tmp_path: Path, storage: str
):
    """S3 takes a name of 1024 bytes, a file system 255: 86 CJK characters are 258 bytes. Listed,
    the key passed unnoticed; staged, the write failed mid-sync (shared-volume) or on every
    training node after its start (object-store)."""
    folder = write_image_folder(tmp_path / "data", classes=("cat", "dog"), per_class=2)
    bucket = f"long-name-{storage}"
    moto_env.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/data"
    sync(str(folder), uri)
    long_name = "猫" * 86 + ".png"
    picture = next((folder / "train" / "cat").iterdir()).read_bytes()
    moto_env.put_object(Bucket=bucket, Key=f"data/train/cat/{long_name}", Body=picture)

    found = DATA_STEPS[storage](uri, tmp_path)
    assert found.images["train"] == {"cat": 2, "dog": 2}  # what every node trains on
    note = found.report_lines()[-1]
    assert note == (
        f"1 key(s) cannot be files on a training node and will be skipped: 'train/cat/{long_name}'"
        " (a name longer than 255 bytes, the most a file system takes); rename them under "
        f"{uri}/ to train on them"
    )


@pytest.mark.parametrize("storage", DATA_STEPS)
def test_class_folders_without_a_split_are_recognised_and_the_split_explained(
    s3, tmp_path: Path, storage: str
):
    """How data sets are often published (Kaggle's flowers: daisy/, rose/, ...): the error said
    train/ was missing and listed the folders, not that they are the classes to split."""
    folder = tmp_path / "flowers"
    write_image_folder(tmp_path / "split", classes=("daisy", "rose"), per_class=2)
    (tmp_path / "split" / "train").rename(folder)
    (folder / "LICENSE.txt").write_text("CC")
    uri = upload(s3, folder, f"unsplit-{storage}")
    with pytest.raises(DatasetLayoutError) as refused:
        DATA_STEPS[storage](uri, tmp_path)
    assert str(refused.value) == (
        f"data_uri={uri!r}: has no train/ folder (it has ['daisy', 'rose']): the pipeline needs "
        f"{uri}/train/<class>/* and {uri}/val/<class>/* (val/ is what the evaluation gate "
        "scores); 'daisy', 'rose' hold images themselves: class folders without a train/val "
        f"split. Move each to {uri}/train/<class>/ and some of each class's images (one in "
        f"five, say) to {uri}/val/<class>/"
    )
