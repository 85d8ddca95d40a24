"""S3 ETags of local bytes: MD5 for single-part objects, ``md5-of-part-md5s-N`` for multipart
ones (which depends on the part size, so the likely sizes for a part count are tried)."""

from __future__ import annotations

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from components.s3_sync.engine import PART_SIZE

HASH_CHUNK = 4 * 1024 * 1024
_ETAG_RE = re.compile(r"^([0-9a-f]{32})(?:-(\d+))?$")
_COMMON_PART_SIZES = (
    PART_SIZE,
    5 * 2**20,
    16 * 2**20,
    15 * 2**20,
    32 * 2**20,
    64 * 2**20,
    100 * 2**20,
    8 * 10**6,
    16 * 10**6,
    10 * 2**20,
    128 * 2**20,
    256 * 2**20,
    512 * 2**20,
)
"""Part sizes that tools use (ours first, then aws-cli/boto3's, s5cmd's, rclone's, ...)."""


class ETag(NamedTuple):
    """An S3 ETag that is an MD5 (``parts`` None) or an ``md5-of-part-md5s-N`` (``parts`` N)."""

    digest: str
    parts: int | None

    @classmethod
    def parse(cls, etag: str) -> ETag | None:
        """None for an ETag that is no MD5 at all (e.g. SSE-KMS objects)."""
        match = _ETAG_RE.match(etag)
        if not match:
            return None
        return cls(match.group(1), int(match.group(2)) if match.group(2) else None)


def is_md5_etag(etag: str) -> bool:
    """Whether ``etag`` is a single-part object's plain MD5."""
    parsed = ETag.parse(etag)
    return parsed is not None and parsed.parts is None


def multipart_candidates(size: int, parts: int, hint: int | None = None) -> list[int]:
    """Part sizes that split ``size`` bytes into exactly ``parts`` parts (likely ones first)."""
    out: list[int] = []
    for ps in ((hint,) if hint else ()) + _COMMON_PART_SIZES:
        if ps not in out and -(-size // ps) == parts:
            out.append(ps)
    return out


def content_etag(path: str | os.PathLike, *, part_size: int | None) -> str:
    """The S3 ETag the file's bytes get: MD5, or md5-of-part-md5s-N when ``part_size`` is set
    and the file has more than one part of that size."""
    return file_hashes(path, part_size=part_size)[1]


def file_hashes(path: str | os.PathLike, *, part_size: int | None) -> tuple[str, str]:
    """(MD5 of the whole file, its S3 ETag for ``part_size``) in one read."""
    whole = hashlib.md5(usedforsecurity=False)
    parts = PartHasher(part_size) if part_size is not None else None
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            whole.update(chunk)
            if parts is not None:
                parts.update(chunk)
    md5 = whole.hexdigest()
    return md5, (parts.etag() if parts is not None else None) or md5


class PartHasher:
    """The MD5s of consecutive ``part_size`` parts of a stream of chunks, and their ETag."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self.digests: list[bytes] = []
        self.hash = hashlib.md5(usedforsecurity=False)
        self.in_part = 0

    def update(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk)
        while view:  # split at the part boundaries
            take = min(len(view), self.part_size - self.in_part)
            self.hash.update(view[:take])
            self.in_part += take
            view = view[take:]
            if self.in_part == self.part_size:
                self.digests.append(self.hash.digest())
                self.hash = hashlib.md5(usedforsecurity=False)
                self.in_part = 0

    def etag(self) -> str | None:
        """The multipart ETag, or None if the bytes were one part (then the ETag is the MD5)."""
        return self.parts_etag() if len(self._digests()) > 1 else None

    def parts_etag(self) -> str:
        """``md5-of-part-md5s-N``, even for N = 1 (a multipart upload of one part)."""
        digests = self._digests()
        return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"

    def _digests(self) -> list[bytes]:
        return self.digests + ([self.hash.digest()] if self.in_part else [])


def multipart_etag_parallel(path: str | os.PathLike, size: int, part_size: int) -> str:
    """``md5-of-part-md5s-N`` of a file, hashing its parts on several threads."""
    count = max(1, -(-size // part_size))
    fd = os.open(path, os.O_RDONLY)
    try:

        def part_md5(index: int) -> bytes:
            h = hashlib.md5(usedforsecurity=False)
            offset, end = index * part_size, min(size, (index + 1) * part_size)
            while offset < end:
                chunk = os.pread(fd, min(HASH_CHUNK, end - offset), offset)
                if not chunk:
                    break
                h.update(chunk)
                offset += len(chunk)
            return h.digest()

        workers = min(count, max(2, os.cpu_count() or 2))
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(part_md5, range(count)))
    finally:
        os.close(fd)
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{count}"


def matching_multipart_etag(path: str | os.PathLike, size: int, etag: str, sizes) -> bool:
    """Whether the file's multipart ETag for one of the part ``sizes`` is ``etag``."""
    return any(multipart_etag_parallel(path, size, ps) == etag for ps in sizes)


def local_content_id(path: str | os.PathLike, size: int) -> str:
    """The ETag our upload gives this file: MD5 below PART_SIZE, else md5-of-part-md5s-N."""
    if size < PART_SIZE:
        return content_etag(path, part_size=None)
    return multipart_etag_parallel(path, size, PART_SIZE)
