"""Checks of a downloaded object before it gets its final name: its size, then its ETag (MD5, or
``md5-of-part-md5s-N`` with the part size S3 reports). Where the ETag is no MD5 (SSE-KMS) the
engines had S3 checksums and If-Match checked on the way instead."""

from __future__ import annotations

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from components.s3_sync.connection import S3Connection
from components.s3_sync.engine import PART_SIZE
from components.s3_sync.errors import S3SyncError
from components.s3_sync.hashing import (
    ETag,
    content_etag,
    matching_multipart_etag,
    multipart_candidates,
)
from components.s3_sync.listing import RemoteObject
from components.s3_sync.local_files import fsync_file
from components.s3_sync.streamed_file import StreamedFile

log = logging.getLogger("components.s3_sync")


class Verifier:
    """Checks downloads of one bucket; each check returns the file's MD5 when it knows it (for
    the hash cache), else None, and raises S3SyncError when the bytes are not the object's."""

    def __init__(self, conn: S3Connection, bucket: str) -> None:
        self.conn = conn
        self.bucket = bucket

    def _corrupt(self, obj: RemoteObject, what: str) -> S3SyncError:
        return S3SyncError(
            f"s3://{self.bucket}/{obj.key}: {what}; the download is corrupt or the object "
            "changed - re-run"
        )

    def check_size(self, obj: RemoteObject, size: int) -> None:
        if size != obj.size:
            raise S3SyncError(
                f"s3://{self.bucket}/{obj.key}: got {size} bytes, the listing says {obj.size}; "
                "the object changed during the sync or the transfer was cut - re-run"
            )

    def in_memory(self, obj: RemoteObject, data: bytes) -> str | None:
        """Bytes of a small object; None when the ETag is not an MD5 (then check the file)."""
        self.check_size(obj, len(data))
        etag = ETag.parse(obj.etag)
        if etag is None or etag.parts is not None:
            return None
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if md5 != obj.etag:
            raise self._corrupt(obj, f"MD5 {md5} != ETag {obj.etag}")
        return md5

    def streamed(self, obj: RemoteObject, got: StreamedFile) -> str | None:
        """A download hashed on the way; the file is hashed where that was not possible."""
        self.check_size(obj, os.path.getsize(got.path))
        if got.etag is None or ETag.parse(obj.etag) is None:
            return self.file_etag(obj, got.path)
        if got.etag != obj.etag and "-" in obj.etag:
            # hashed with the likeliest part size; ask S3 for the real one and hash again
            return self.file_etag(obj, got.path)
        if got.etag != obj.etag:
            raise self._corrupt(
                obj, f"the downloaded bytes have ETag {got.etag}, the object {obj.etag}"
            )
        return got.md5

    def written(self, obj: RemoteObject, path: str, *, fsync: bool) -> str | None:
        """A file the engine wrote; with ``fsync`` it is also flushed (while it is hashed)."""
        size = os.path.getsize(path)
        self.check_size(obj, size)
        if not fsync:
            return self.file_etag(obj, path)
        if size < PART_SIZE:
            fsync_file(path)
            return self.file_etag(obj, path)
        with ThreadPoolExecutor(1) as syncer:  # big file: flush to disk while we hash
            flushed = syncer.submit(fsync_file, path)
            try:
                return self.file_etag(obj, path)
            finally:
                flushed.result()

    def file_etag(self, obj: RemoteObject, path: str) -> str | None:
        """Hash the file and compare with the object's ETag."""
        etag = ETag.parse(obj.etag)
        if etag is None:
            return None  # e.g. SSE-KMS: the ETag is not an MD5; checksums were checked
        if etag.parts is None:
            md5 = content_etag(path, part_size=None)
            if md5 != obj.etag:
                raise self._corrupt(obj, f"MD5 {md5} != ETag {obj.etag}")
            return md5
        hint = self.conn.first_part_size(self.bucket, obj.key)
        if matching_multipart_etag(
            path, obj.size, obj.etag, multipart_candidates(obj.size, etag.parts, hint)
        ):
            return None
        if hint is not None:
            raise S3SyncError(
                f"s3://{self.bucket}/{obj.key}: multipart ETag {obj.etag} does not match the "
                f"downloaded bytes (part size {hint}); the download is corrupt - re-run"
            )
        log.warning(
            "s3-sync: s3://%s/%s: part size of multipart ETag %s unknown; checked size only",
            self.bucket,
            obj.key,
            obj.etag,
        )
        return None
