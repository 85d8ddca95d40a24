"""Local folder → S3 against a real SeaweedFS."""

from __future__ import annotations

import os

import pytest

from components.s3_sync import S3SyncError, sync
from components.s3_sync.hashing import content_etag
from tests.s3_sync.s3_helpers import CountingProxy, list_keys, md5


@pytest.fixture
def model_dir(tmp_path):
    root = tmp_path / "model"
    (root / "checkpoints" / "step-10").mkdir(parents=True)
    (root / "weights.pt").write_bytes(os.urandom(3000))
    (root / "model.json").write_text('{"arch": "resnet18"}')
    (root / "checkpoints" / "step-10" / "COMPLETE").write_bytes(b"")
    (root / "ünï côde.txt").write_text("ok")
    return root


def test_upload_then_noop_then_change(model_dir, s3_env, bucket):
    client = s3_env.client()
    first = sync(model_dir, f"s3://{bucket}/models/run-1")
    keys = list_keys(client, bucket)
    assert sorted(keys) == sorted(
        f"models/run-1/{p}"
        for p in ("weights.pt", "model.json", "checkpoints/step-10/COMPLETE", "ünï côde.txt")
    )
    assert keys["models/run-1/weights.pt"] == (model_dir / "weights.pt").read_bytes()
    assert first.transferred == 4 and first.files == 4 and first.skipped == 0
    head = client.head_object(Bucket=bucket, Key="models/run-1/weights.pt")
    assert head["ETag"].strip('"') == md5((model_dir / "weights.pt").read_bytes())

    with CountingProxy(s3_env.endpoint_url) as proxy:
        again = sync(model_dir, f"s3://{bucket}/models/run-1", endpoint_url=proxy.endpoint_url)
    assert again.transferred == 0 and again.skipped == 4 and again.digest == first.digest
    assert dict(proxy.counts) == {"LIST": 1}

    (model_dir / "model.json").write_text('{"arch": "resnet50"}')
    changed = sync(model_dir, f"s3://{bucket}/models/run-1")
    assert changed.transferred == 1 and changed.digest != first.digest
    assert list_keys(client, bucket)["models/run-1/model.json"] == b'{"arch": "resnet50"}'


def test_upload_delete_stays_under_prefix(model_dir, s3_env, bucket):
    client = s3_env.client()
    client.put_object(Bucket=bucket, Key="models/run-1/old.bin", Body=b"old")
    client.put_object(Bucket=bucket, Key="models/run-10/keep.bin", Body=b"sibling prefix")
    client.put_object(Bucket=bucket, Key="models/other.bin", Body=b"outside")
    # old.bin is all the prefix holds: deleting it takes consent (delete_guard.py)
    dry = sync(model_dir, f"s3://{bucket}/models/run-1", delete=True, max_delete=1, dry_run=True)
    assert dry.deleted == 1 and "models/run-1/old.bin" in list_keys(client, bucket)
    report = sync(model_dir, f"s3://{bucket}/models/run-1", delete=True, max_delete=1)
    keys = list_keys(client, bucket)
    assert report.deleted == 1 and "models/run-1/old.bin" not in keys
    assert keys["models/run-10/keep.bin"] == b"sibling prefix"
    assert keys["models/other.bin"] == b"outside"


def test_big_file_upload_is_multipart_and_roundtrips(tmp_path, s3_env, bucket):
    src = tmp_path / "big"
    src.mkdir()
    data = os.urandom(17 * 1024 * 1024 + 5)
    (src / "blob.bin").write_bytes(data)
    report = sync(src, f"s3://{bucket}/b")
    assert report.bytes_transferred == len(data)
    etag = s3_env.client().head_object(Bucket=bucket, Key="b/blob.bin")["ETag"].strip('"')
    assert etag.endswith("-3") and etag == content_etag(src / "blob.bin", part_size=8 * 2**20)
    down = sync(f"s3://{bucket}/b", tmp_path / "down")
    assert down.transferred == 1 and (tmp_path / "down" / "blob.bin").read_bytes() == data
    assert sync(src, f"s3://{bucket}/b").transferred == 0


def test_upload_include_exclude_and_missing_source(model_dir, s3_env, bucket, tmp_path):
    report = sync(model_dir, f"s3://{bucket}/f", include=["*.json", "*.pt"], exclude=["*.pt"])
    assert report.files == 1 and list(list_keys(s3_env.client(), bucket)) == ["f/model.json"]
    with pytest.raises(S3SyncError, match="does not exist"):
        sync(tmp_path / "nope", f"s3://{bucket}/f")
    with pytest.raises(S3SyncError, match="exactly one side"):
        sync(tmp_path, tmp_path / "x")


def test_classic_engine_upload_roundtrip(model_dir, s3_env, bucket, tmp_path):
    report = sync(model_dir, f"s3://{bucket}/c", engine="classic", max_concurrency=4)
    assert report.engine == "classic" and report.transferred == 4
    assert sync(model_dir, f"s3://{bucket}/c", engine="classic").transferred == 0
    down = sync(f"s3://{bucket}/c", tmp_path / "back", engine="classic")
    assert (
        down.digest
        and (tmp_path / "back" / "weights.pt").read_bytes()
        == (model_dir / "weights.pt").read_bytes()
    )


def test_options_are_validated(tmp_path):
    from components.s3_sync import SyncOptions

    opts = SyncOptions(source="s3://bkt/p", destination=str(tmp_path), include="*.png")
    assert opts.include == ("*.png",)  # a lone string is one pattern
    for bad in ({"engine": "fast"}, {"max_concurrency": 0}, {"addressing_style": "odd"}):
        with pytest.raises(S3SyncError, match=next(iter(bad))):
            SyncOptions(source="s3://bkt/p", destination=str(tmp_path), **bad)


def test_a_downloaded_big_file_uploads_once(s3_env, bucket, tmp_path):
    """A big object stored with one PUT: the download caches the file's plain MD5, which is not
    the multipart ETag our upload gives it. The upload must not take one for the other."""
    data = os.urandom(9 * 2**20)
    s3_env.client().put_object(Bucket=bucket, Key="one/big.bin", Body=data)
    folder = tmp_path / "f"
    assert sync(f"s3://{bucket}/one", folder).transferred == 1
    first = sync(folder, f"s3://{bucket}/copy")
    assert first.transferred == 1
    again = sync(folder, f"s3://{bucket}/copy")
    assert again.transferred == 0 and again.digest == first.digest
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "big.bin").write_bytes(data)
    assert sync(fresh, f"s3://{bucket}/copy", dry_run=True).digest == first.digest


def test_a_name_that_is_not_utf8_is_refused_before_anything_is_sent(s3_env, bucket, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "fine.txt").write_text("ok")
    with open(os.fsencode(src) + b"/na\xefve.txt", "wb") as odd:  # Latin-1
        odd.write(b"bytes")
    with pytest.raises(S3SyncError, match=r"1 file name\(s\) under .* are not UTF-8") as raised:
        sync(src, f"s3://{bucket}/d")
    assert "'na\\xefve.txt'" in str(raised.value)
    assert list_keys(s3_env.client(), bucket) == {}  # not even the other file
    # left out by a filter, it is no reason to refuse
    assert sync(src, f"s3://{bucket}/d", exclude=["na*"]).transferred == 1
