"""Atomic file writes: temp file in the same folder, fsync, rename, fsync the folder.

A reader (another rank, the evaluation step, a restarted trainer) sees either the old file or the
complete new one, never a torn write, even if the process is killed mid-write. Files get the
permissions a plain ``open()`` would give (0666 less the umask), not ``mkstemp``'s 0600: on a
cluster the steps that read them (evaluation, publishing) may run as another user.

The one atomic-write helper of the package (stdlib only; the components and pipelines use it too).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


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


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race with other threads)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_atomic(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Create or replace ``path`` with what ``write(file)`` writes, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """Create or replace the text file ``path`` (UTF-8), atomically."""
    data = text.encode("utf-8")
    write_atomic(path, lambda handle: handle.write(data))


def write_json_atomic(path: Path, data: Any) -> None:
    """Create or replace ``path`` with ``data`` as indented, key-sorted JSON, atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def torch_save_atomic(obj: Any, path: Path) -> None:
    import torch

    write_atomic(path, lambda handle: torch.save(obj, handle))
