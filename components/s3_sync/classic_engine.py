"""The ``classic`` engine: botocore on a thread pool for small objects (one GET/PUT each on the
shared client), an s3transfer ``TransferManager`` (multipart, parallel ranged GETs) for objects
of PART_SIZE and more. Retries are botocore's (its retry modes)."""

from __future__ import annotations

import base64
import hashlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from components.s3_sync.connection import S3Connection
from components.s3_sync.engine import IN_MEMORY_MAX, PART_SIZE, OnBytes, OnDownloaded
from components.s3_sync.errors import S3SyncError
from components.s3_sync.hashing import is_md5_etag

_STREAM_CHUNK = 1024 * 1024


class ClassicEngine:
    name = "classic"

    def __init__(self, conn: S3Connection, *, max_concurrency: int) -> None:
        from s3transfer.manager import TransferConfig

        self.conn = conn
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="s3sync")
        self.transfer_config = TransferConfig(
            multipart_threshold=PART_SIZE,
            multipart_chunksize=PART_SIZE,
            max_request_concurrency=min(16, max_concurrency),
        )
        self._manager = None
        self._lock = threading.Lock()

    def _big(self):
        """The TransferManager for big objects (made on first use)."""
        with self._lock:
            if self._manager is None:
                from s3transfer.manager import TransferManager

                self._manager = TransferManager(self.conn.client, self.transfer_config)
            return self._manager

    def download(
        self,
        bucket: str,
        key: str,
        size: int,
        etag: str,
        temp_path: str,
        on_bytes: OnBytes,
        done: OnDownloaded,
    ) -> None:
        """Start fetching one object; see ``engine.OnDownloaded`` for ``done``."""
        if size >= PART_SIZE:
            fut: Future = Future()
            self._big().download(
                bucket, key, temp_path, subscribers=[_DoneSubscriber(on_bytes, fut)]
            )
        else:
            fut = self.pool.submit(
                _SmallDownload(self.conn, bucket, key, size, etag).run, temp_path, on_bytes
            )
        fut.add_done_callback(lambda f: _relay(f, done))

    def upload(
        self, path: str, bucket: str, key: str, size: int, md5: str, on_bytes: OnBytes
    ) -> Future:
        if size >= PART_SIZE:
            done: Future = Future()
            self._big().upload(path, bucket, key, subscribers=[_DoneSubscriber(on_bytes, done)])
            return done
        return self.pool.submit(self._upload_small, path, bucket, key, size, md5, on_bytes)

    def _upload_small(
        self, path: str, bucket: str, key: str, size: int, md5: str, on_bytes: OnBytes
    ) -> None:
        with open(path, "rb") as fh:
            data = fh.read()
        if hashlib.md5(data, usedforsecurity=False).hexdigest() != md5:
            raise S3SyncError(f"local file {path} changed while it was being uploaded; re-run")
        # Content-MD5: the server refuses the PUT if the bytes it got differ.
        self.conn.client.put_object(
            Bucket=bucket,
            Key=key,
            Body=data,
            ContentMD5=base64.b64encode(bytes.fromhex(md5)).decode(),
        )
        on_bytes(size)

    def shutdown(self, *, cancel: bool = False) -> None:
        self.pool.shutdown(wait=not cancel, cancel_futures=cancel)
        if self._manager is None:
            return
        if cancel:
            # s3transfer 0.19's shutdown(cancel=True) passes its arguments in the wrong order
            # (TypeError); leaving the context manager on an interrupt cancels right.
            interrupt = KeyboardInterrupt("sync interrupted")
            self._manager.__exit__(KeyboardInterrupt, interrupt, None)
        else:
            self._manager.shutdown()


class _SmallDownload:
    """One GET of an object below PART_SIZE on a pool thread."""

    def __init__(self, conn: S3Connection, bucket: str, key: str, size: int, etag: str) -> None:
        self.conn, self.bucket, self.key, self.size, self.etag = conn, bucket, key, size, etag

    def run(self, temp_path: str, on_bytes: OnBytes) -> bytes | None:
        """The bytes (up to IN_MEMORY_MAX), else None with the bytes written to ``temp_path``."""
        extra: dict[str, str] = {}
        if not is_md5_etag(self.etag):  # bytes not checkable by MD5: ask S3 to check them
            extra["ChecksumMode"] = "ENABLED"
            if self.etag:
                extra["IfMatch"] = f'"{self.etag}"'
        body = self.conn.client.get_object(Bucket=self.bucket, Key=self.key, **extra)["Body"]
        if self.size <= IN_MEMORY_MAX:
            data = body.read()
            on_bytes(self.size)
            return data
        with open(temp_path, "wb") as fh:
            for chunk in iter(lambda: body.read(_STREAM_CHUNK), b""):
                fh.write(chunk)
        on_bytes(self.size)
        return None


class _DoneSubscriber:
    """s3transfer subscriber: progress, and a concurrent Future resolved when all is done."""

    def __init__(self, on_bytes: OnBytes, done: Future) -> None:
        self._on_bytes = on_bytes
        self._done = done

    def on_queued(self, future, **kwargs) -> None:
        pass

    def on_progress(self, future, bytes_transferred, **kwargs) -> None:
        self._on_bytes(bytes_transferred)

    def on_done(self, future, **kwargs) -> None:
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._done.set_exception(exc)
        else:
            self._done.set_result(None)


def _relay(fut: Future, done: OnDownloaded) -> None:
    """Hand a finished future's outcome to a ``done(body, error)`` callback."""
    if fut.cancelled():
        done(None, S3SyncError("the sync was interrupted before this transfer started"))
        return
    error = fut.exception()
    done(None if error is not None else fut.result(), error)
