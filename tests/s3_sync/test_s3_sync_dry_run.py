"""``dry_run`` lists what it would transfer and delete, and touches nothing: no file, no temp
file, no hash-cache write, no request that writes."""

from __future__ import annotations

import os

import pytest

from components.s3_sync import S3SyncUsageError, sync
from components.s3_sync.hash_cache import hash_cache_path
from tests.s3_sync.s3_helpers import CountingProxy, list_keys, put_objects
from tests.s3_sync.test_s3_sync_errors import _cli


def _snapshot(root) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` (temp files too) with its size and mtime."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.stat(os.path.join(dirpath, name), follow_symlinks=False)
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_download_dry_run_lists_and_touches_nothing(s3_env, bucket, tmp_path):
    objects = {"d/new.txt": b"new", "d/same.txt": b"same", "d/changed.txt": b"NEW!"}
    put_objects(s3_env.client(), bucket, objects)
    dest = tmp_path / "dest"
    (dest / "gone").mkdir(parents=True)
    (dest / "same.txt").write_bytes(b"same")
    (dest / "changed.txt").write_bytes(b"old!")
    (dest / "gone" / "stale.txt").write_bytes(b"stale")
    (dest / ".same.txt.s3sync-0123abcd.tmp").write_bytes(b"a leftover of a killed run")
    before = _snapshot(dest)
    with CountingProxy(s3_env.endpoint_url) as proxy:
        report = sync(
            f"s3://{bucket}/d", dest, endpoint_url=proxy.endpoint_url, delete=True, dry_run=True
        )
    assert report.dry_run
    assert sorted(report.would_transfer) == ["changed.txt", "new.txt"]
    assert report.would_delete == ["gone/stale.txt"]
    assert (report.transferred, report.skipped, report.deleted) == (2, 1, 1)
    assert "would transfer 2 of 3 files" in report.summary()
    assert "would delete 1" in report.summary()
    assert _snapshot(dest) == before  # not even the stale temp file was removed
    assert not hash_cache_path(dest).exists()  # the hashes it computed were not saved
    assert set(proxy.counts) == {"LIST"}
    # the real run does what the dry run listed
    done = sync(f"s3://{bucket}/d", dest, delete=True)
    assert (done.transferred, done.deleted) == (2, 1)


def test_upload_dry_run_sends_no_write_request(s3_env, bucket, tmp_path):
    put_objects(s3_env.client(), bucket, {"u/stale.bin": b"s", "u/same.bin": b"same"})
    src = tmp_path / "src"
    src.mkdir()
    (src / "same.bin").write_bytes(b"same")
    (src / "new.bin").write_bytes(b"new")
    with CountingProxy(s3_env.endpoint_url) as proxy:
        report = sync(
            src, f"s3://{bucket}/u", endpoint_url=proxy.endpoint_url, delete=True, dry_run=True
        )
    assert (report.would_transfer, report.would_delete) == (["new.bin"], ["stale.bin"])
    assert set(proxy.counts) == {"LIST"}
    assert list_keys(s3_env.client(), bucket) == {"u/stale.bin": b"s", "u/same.bin": b"same"}
    assert not hash_cache_path(src).exists()


def test_dry_run_refuses_what_the_real_run_would_refuse(s3_env, bucket, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a.txt").write_bytes(b"a")
    with pytest.raises(S3SyncUsageError, match="empty source"):
        sync(f"s3://{bucket}/nothing-here", dest, delete=True, dry_run=True)
    assert (dest / "a.txt").exists()


def test_cli_dry_run_lists_each_path(s3_env, bucket, tmp_path):
    put_objects(s3_env.client(), bucket, {"c/a.txt": b"a", "c/sub/b.txt": b"b"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old.txt").write_bytes(b"old")
    # old.txt is all the destination holds: deleting it takes consent (delete_guard.py)
    proc = _cli(f"s3://{bucket}/c", str(dest), "--delete", "--max-delete", "1", "--dry-run", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("s3-sync: would transfer 2 of 2 files")
    lines = proc.stderr.splitlines()
    assert "s3-sync: would transfer a.txt" in lines and "s3-sync: would transfer sub/b.txt" in lines
    assert "s3-sync: would delete old.txt" in lines
    assert sorted(p.name for p in dest.iterdir()) == ["old.txt"]
