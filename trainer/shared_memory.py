"""``/dev/shm``: the memory file system a DataLoader worker's batches travel through to the
training process (sized by the pod's ``shm_size``)."""

from __future__ import annotations

import os

SHM_PATH = "/dev/shm"


def shm_bytes(path: str = SHM_PATH) -> int | None:
    """Size of the shared-memory file system DataLoader batches travel through (None: none)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize
