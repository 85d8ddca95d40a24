"""Atomic file writes: temp file in the same folder, fsync, rename, fsync the folder.

A reader (another rank, the evaluation step, a restarted trainer) sees either the old file or the
complete new one, never a torn write, even if the process is killed mid-write.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch


def fsync_dir(folder: Path) -> None:
    """Persist a rename/creation inside ``folder`` (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Create or replace ``path`` with what ``write(file)`` writes, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Any) -> None:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    write_atomic(path, lambda handle: handle.write(text.encode()))


def torch_save_atomic(obj: Any, path: Path) -> None:
    write_atomic(path, lambda handle: torch.save(obj, handle))
