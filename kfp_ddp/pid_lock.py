"""A lock file that names its holder: ``flock`` on it (the kernel releases it however the process
ends) and the holder's pid in it, so that whoever is refused can be told who holds it.

Used for a local S3 server's data folder (``kfp_ddp.local_s3``) and a local run's workspace
(``pipelines.workspace_lock``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeld(RuntimeError):
    """Another process holds the lock; ``holder`` is its pid as it wrote it ('?' if unknown)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by pid {holder}")
        self.holder = holder


def hold(path: Path) -> int:
    """Take the lock file ``path`` (created if missing) and write this pid in it; the open file
    descriptor, whose closing releases the lock. LockHeld if another process has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise LockHeld(path, holder) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def holder(path: Path) -> str | None:
    """The pid holding the lock file ``path``, or None when no process holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "?"
        return None
    finally:
        os.close(fd)
