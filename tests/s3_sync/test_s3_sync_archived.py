"""Objects archived in S3 Glacier (a lifecycle rule's doing): a download names those not restored
before it transfers anything, a dry run (the pipeline's data step) too; a GET that meets one says
what it is, not "access denied" (both 403s). Against moto, which archives as AWS S3 does."""

from __future__ import annotations

import pytest

from components.s3_sync import S3SyncError, sync
from components.s3_sync import archived as archived_module
from pipelines.dataset import inspect_dataset
from tests.image_data import write_image_folder
from tests.s3_sync.s3_helpers import read_tree


@pytest.fixture
def archived_bucket(moto_env, request) -> str:
    """s3://<bucket>/d: a.txt (STANDARD), g.txt (GLACIER), r.txt (DEEP_ARCHIVE, restored)."""
    bucket = f"archived-{request.node.name.split('[')[-1].strip(']').lower()}"[:60]
    bucket = bucket.replace("_", "-")
    moto_env.create_bucket(Bucket=bucket)
    moto_env.put_object(Bucket=bucket, Key="d/a.txt", Body=b"a")
    moto_env.put_object(Bucket=bucket, Key="d/g.txt", Body=b"g", StorageClass="GLACIER")
    moto_env.put_object(Bucket=bucket, Key="d/r.txt", Body=b"r", StorageClass="DEEP_ARCHIVE")
    moto_env.restore_object(Bucket=bucket, Key="d/r.txt", RestoreRequest={"Days": 1})
    return bucket


@pytest.mark.parametrize("engine", ["crt", "classic"])
def test_an_archived_object_not_restored_is_named_before_anything_is_transferred(
    archived_bucket, tmp_path, engine
):
    dest = tmp_path / "dest"
    for dry_run in (True, False):
        with pytest.raises(S3SyncError) as refused:
            sync(f"s3://{archived_bucket}/d", dest, engine=engine, dry_run=dry_run)
        message = str(refused.value)
        assert message.startswith(
            f"1 object(s) under s3://{archived_bucket}/d/ are archived and not restored: "
            "'g.txt' (GLACIER); no one can read them until they are restored: restore each "
            "(aws s3api restore-object"
        ), message
        assert "access denied" not in message
        assert not dest.exists() or read_tree(dest) == {}  # nothing transferred


def test_once_restored_every_object_is_downloaded(archived_bucket, moto_env, tmp_path):
    moto_env.restore_object(Bucket=archived_bucket, Key="d/g.txt", RestoreRequest={"Days": 1})
    report = sync(f"s3://{archived_bucket}/d", tmp_path / "dest")
    assert report.transferred == 3
    assert read_tree(tmp_path / "dest") == {"a.txt": b"a", "g.txt": b"g", "r.txt": b"r"}


@pytest.mark.parametrize("engine", ["crt", "classic"])
def test_a_get_of_an_archived_object_says_so_not_access_denied(
    archived_bucket, tmp_path, engine, monkeypatch
):
    """Past the objects asked about first (none here), the GET finds it and names the cause."""
    monkeypatch.setattr(archived_module, "CHECKED_MAX", 0)
    with pytest.raises(S3SyncError) as failed:
        sync(f"s3://{archived_bucket}/d", tmp_path / "dest", engine=engine)
    message = str(failed.value)
    assert f"s3://{archived_bucket}/d/g.txt is archived" in message, message
    assert "access denied" not in message and "s3:GetObject" not in message


def test_the_data_step_refuses_a_data_set_with_archived_images(moto_env, tmp_path):
    """The object-store data step lists (a dry run): it refuses before any node starts."""
    folder = write_image_folder(tmp_path / "data", classes=("cat", "dog"), per_class=2)
    moto_env.create_bucket(Bucket="archived-data-step")
    uri = "s3://archived-data-step/pets"
    sync(str(folder), uri)
    old = next((folder / "train" / "dog").iterdir())
    moto_env.copy_object(
        Bucket="archived-data-step",
        Key=f"pets/train/dog/{old.name}",
        CopySource={"Bucket": "archived-data-step", "Key": f"pets/train/dog/{old.name}"},
        StorageClass="DEEP_ARCHIVE",
    )  # what a lifecycle rule does to an old image
    with pytest.raises(S3SyncError) as refused:
        inspect_dataset(uri)
    assert f"'train/dog/{old.name}' (DEEP_ARCHIVE)" in str(refused.value)
