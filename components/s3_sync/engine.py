"""The transfer engines' common interface and the sizes they share (the choice: ``engines.py``).

- ``crt`` (``crt_engine.py``): the AWS Common Runtime's S3 client (``awscrt.s3``) signs, sends,
  retries and splits requests into parallel ranged parts / multipart uploads in native threads,
  which is what makes thousands of small objects fast from Python. Used when ``awscrt`` (from
  ``botocore[crt]``) is importable.
- ``classic`` (``classic_engine.py``): botocore (its retry modes) on a thread pool for small
  objects, s3transfer's ``TransferManager`` for big ones.

Neither is hand-written multipart or retry code; the caller verifies every download.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

MiB = 1024 * 1024
PART_SIZE = 8 * MiB
"""Part size for multipart uploads and ranged downloads (also the multipart threshold)."""
IN_MEMORY_MAX = 256 * 1024
"""Objects up to this size are downloaded into memory, verified there and written by us: the
CRT's own file writing (``recv_filepath``) costs ~0.25 ms of CPU per file, more than the GET.
With at most a few hundred requests in flight this bounds the buffered bytes to ~64 MiB."""
ENGINES = ("auto", "crt", "classic")

OnBytes = Callable[[int], None]
"""Progress callback: this many more bytes moved."""
OnDownloaded = Callable[[object, BaseException | None], None]
"""``done(body, error)``, called once per download on some transfer thread: ``body`` is the
object's bytes (objects up to ``IN_MEMORY_MAX``, nothing written), a ``StreamedFile`` (written
to the temp file and hashed on the way), or None (the bytes are in the temp file)."""


class Engine(Protocol):
    name: str

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
        """Start fetching one object; ``done`` reports the outcome."""

    def upload(
        self, path: str, bucket: str, key: str, size: int, md5: str, on_bytes: OnBytes
    ) -> Future:
        """Start sending one file (``md5``: its MD5 below PART_SIZE, checked by the server)."""

    def shutdown(self, *, cancel: bool = False) -> None:
        """Wait for (or with ``cancel``, cancel) what is in flight."""
