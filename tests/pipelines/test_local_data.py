"""``run-local --data``'s served copy of a folder is the folder: what left the folder leaves it."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from pipelines.cli import main
from pipelines.local_data import links_not_served, served_folder
from tests.image_data import write_image_folder


def _served_keys(served) -> list[str]:
    bucket, _, prefix = served.data_uri.removeprefix("s3://").partition("/")
    listed = served.server.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    return sorted(item["Key"].removeprefix(f"{prefix}/") for item in listed.get("Contents", []))


def test_a_file_moved_or_deleted_in_the_folder_leaves_the_served_copy(tmp_path: Path):
    """The usual second run: the data step said val/ lacks images of a class, so one is moved
    from train/ to val/, and a bad image is deleted. The served copy kept both: the moved image
    was then in train/ and val/ (scored on what it trained on), the bad one still trained on."""
    folder = write_image_folder(tmp_path / "flowers", classes=("daisy", "rose"), per_class=3)
    with served_folder(folder, tmp_path / "s3-data") as first:
        assert first.upload.transferred == 14 and first.upload.deleted == 0

    moved = folder / "train" / "rose" / "train-000.png"
    moved.rename(folder / "val" / "rose" / "moved.png")
    (folder / "train" / "daisy" / "train-001.png").unlink()
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    with served_folder(folder, tmp_path / "s3-data") as second:
        assert _served_keys(second) == files
        assert (second.upload.transferred, second.upload.deleted) == (1, 2)


def test_links_the_upload_does_not_follow_are_refused_before_anything_starts(tmp_path: Path):
    """A data set assembled with links (train/ -> a bigger disk): the folder's own check read
    through them and passed, the upload left them out (it follows no linked folder), and the run
    failed at its data step with "has no train/ folder (it has ['val'])"."""
    folder = write_image_folder(tmp_path / "flowers", per_class=1, val_per_class=1)
    elsewhere = tmp_path / "big-disk" / "train"
    elsewhere.parent.mkdir()
    (folder / "train").rename(elsewhere)
    (folder / "train").symlink_to(elsewhere)
    inside = folder / "val" / "circle" / "same.png"
    inside.symlink_to(next((folder / "val" / "circle").iterdir()))  # a file link inside: served
    assert links_not_served(folder) == [f"'train' -> {elsewhere}"]

    workspace = tmp_path / "workspace"
    args = ["run-local", "--data", str(folder), "--workspace", str(workspace)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"'--data': {folder}: 'train' -> {elsewhere}: the local S3 server gets a copy" in (
        result.output
    )
    assert not (workspace / "s3-data").exists()  # refused before the server started


def test_a_file_name_that_is_not_utf8_is_named_before_anything_is_uploaded(tmp_path: Path):
    """A data set unpacked from an archive whose names are Latin-1: Python reads such a name
    with a surrogate escape, which no S3 key can hold, and the upload failed part-way with a
    UnicodeEncodeError traceback."""
    folder = write_image_folder(tmp_path / "photos", per_class=2, val_per_class=1)
    image = next((folder / "train" / "circle").iterdir())
    os.rename(image, os.fsencode(image.parent) + b"/caf\xe9.png")

    args = ["run-local", "--data", str(folder), "--workspace", str(tmp_path / "workspace")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1] == (
        f"Error: 1 file name(s) under {str(folder)!r} are not UTF-8, which S3 keys must be: "
        "'train/circle/caf\\xe9.png'; rename them to UTF-8 (from Latin-1, for example: "
        f"convmv -f latin1 -t utf8 -r --notest {str(folder)!r}); nothing was uploaded"
    )
