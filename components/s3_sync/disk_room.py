"""Room for a download, checked before its first byte: a disk that cannot hold what a download
will write is named with both sizes, instead of failing part-way ("No space left on device" on
some of the files, the others written).

The need is each file's size rounded up to the file system's block (small images take a whole
block each: ImageNet's 1.28 M files take ~2 % more than their bytes); the room is what
``statvfs`` says is free to this user on the destination's file system (the nearest folder of
it that exists). A replaced file is not counted as freed: its new copy is written beside it
before the rename.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from components.s3_sync.errors import S3SyncError
from components.s3_sync.fetch import Target


def _existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:,.0f} {unit}" if unit == "bytes" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def check_room(dest: Path, fetch: Sequence[Target]) -> None:
    """Raise S3SyncError if the file system under ``dest`` has less room than ``fetch`` needs."""
    if not fetch:
        return
    stats = os.statvfs(_existing(dest))
    if not stats.f_blocks:  # a file system that reports no size (some FUSE mounts): unknown
        return
    block = stats.f_frsize or 4096
    need = sum(-(-target.obj.size // block) * block for target in fetch)
    free = stats.f_bavail * stats.f_frsize
    if need <= free:
        return
    raise S3SyncError(
        f"not enough room under {dest}: the download needs {_size(need)} for {len(fetch):,} "
        f"file(s) and the disk has {_size(free)} free; free space there, or sync onto a bigger "
        "volume"
    )
