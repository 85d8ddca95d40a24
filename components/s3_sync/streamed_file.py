"""A download written to its temp file as the body arrives, and hashed on the way."""

from __future__ import annotations

import hashlib
import os

from components.s3_sync.engine import OnBytes
from components.s3_sync.hashing import PartHasher


class StreamedFile:
    """The CRT's ``on_body`` target for an object too big to keep in memory.

    After ``close`` ``etag`` is the S3 ETag of the bytes (MD5, or ``md5-of-part-md5s-N`` for
    ``part_size``) and ``md5`` the whole file's MD5 (single-part objects), or None for what
    could not be computed (multipart with an unknown part size, or a body that did not arrive
    in order): the caller then hashes the file.
    """

    def __init__(
        self, path: str, part_size: int | None, *, multipart: bool, on_bytes: OnBytes | None = None
    ) -> None:
        self.path = path
        self.on_bytes = on_bytes
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self.offset = 0
        self.multipart = multipart
        self.hashing = not multipart or part_size is not None  # else: unknown part size
        self._whole = hashlib.md5(usedforsecurity=False)
        self._parts = PartHasher(part_size) if multipart and part_size else None
        self.md5: str | None = None
        self.etag: str | None = None

    def write(self, chunk, offset: int, **_) -> None:
        """The CRT's on_body callback (a transfer thread)."""
        view = memoryview(chunk)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        if offset != self.offset:  # never seen: the CRT delivers bodies in order
            self.hashing = False
        self.offset = offset + len(view)
        if self.on_bytes is not None:
            self.on_bytes(len(view))
        if not self.hashing:
            return
        if self._parts is not None:
            self._parts.update(view)
        else:
            self._whole.update(view)

    def close(self, error: BaseException | None) -> BaseException | None:
        """Close the file; returns ``error``, or the error of closing it."""
        try:
            os.close(self.fd)
        except OSError as exc:
            error = error or exc
        if error is None and self.hashing:
            if self._parts is not None:
                self.etag = self._parts.parts_etag()
            else:
                self.md5 = self.etag = self._whole.hexdigest()
        return error
