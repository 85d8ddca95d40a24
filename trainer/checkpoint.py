"""Step checkpoints: ``CHECKPOINT_DIR/step-N/state.pt`` plus a ``COMPLETE`` marker written last.

A folder counts only once its marker exists, and both files are written atomically, so a process
killed at any moment leaves either a complete checkpoint or one that is ignored (and later
removed). ``state.pt`` holds plain types and tensors only: it loads with
``torch.load(weights_only=True)``.

The marker vouches for the bytes: it records the size and sha256 of ``state.pt`` (hashed as
``torch.save`` writes, no second read), and a checkpoint whose bytes differ is unusable. Loading
alone would not notice: ``torch.load`` reads tensors with flipped bytes without complaint.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import IO, Any, cast

import torch

from kfp_ddp.atomic_files import fsync_dir, write_atomic, write_json_atomic

FORMAT_VERSION = 1
STATE_FILE = "state.pt"
MARKER_FILE = "COMPLETE"
REQUIRED_KEYS = (
    "format_version",
    "step",
    "epoch",
    "batch_in_epoch",
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "rng",
    "config",
)
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint folder that cannot be used."""


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``step-N`` folder in ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def is_complete(folder: Path) -> bool:
    return (Path(folder) / MARKER_FILE).is_file()


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, newest first."""
    return [folder for _, folder in reversed(step_dirs(root)) if is_complete(folder)]


def latest_complete_checkpoint(root: Path) -> Path | None:
    complete = complete_checkpoints(root)
    return complete[0] if complete else None


def save_checkpoint(root: Path, step: int, state: dict[str, Any], *, keep: int) -> Path:
    """Write ``root/step-{step}`` (state first, marker last), then keep the newest ``keep``."""
    root = Path(root)
    folder = root / f"step-{step}"
    if folder.exists():  # leftover of an interrupted save, or a corrupt one set aside earlier
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    fsync_dir(root)
    try:
        written = _HashingWriter()
        write_atomic(
            folder / STATE_FILE,
            lambda handle: torch.save(state, cast(IO[bytes], written.to(handle))),
        )
        write_json_atomic(
            folder / MARKER_FILE,
            {
                "format_version": FORMAT_VERSION,
                "step": step,
                "saved_at": time.time(),
                "state_bytes": written.size,
                "state_sha256": written.sha256.hexdigest(),
            },
        )
    except BaseException:
        # Without its marker the folder never counts; removing it now gives the space back.
        shutil.rmtree(folder, ignore_errors=True)
        raise
    prune_checkpoints(root, keep)
    return folder


class _HashingWriter:
    """Passes ``torch.save``'s writes on to a file, counting and hashing them on the way."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._handle: Any = None

    def to(self, handle: Any) -> _HashingWriter:
        self._handle = handle
        return self

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        self.size += memoryview(data).nbytes
        return self._handle.write(data)

    def flush(self) -> None:
        self._handle.flush()


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints, and incomplete leftovers.

    Only rank 0 writes checkpoints, one at a time, so any incomplete folder seen here is the
    remnant of a process killed mid-save.
    """
    for folder in complete_checkpoints(root)[keep:]:
        shutil.rmtree(folder, ignore_errors=True)
    for _, folder in step_dirs(root):
        if not is_complete(folder):
            shutil.rmtree(folder, ignore_errors=True)
    fsync_dir(root)


def read_marker(folder: Path) -> dict[str, Any]:
    """The ``COMPLETE`` marker's fields ({} for an unreadable one: older markers held no more)."""
    try:
        marker = json.loads((Path(folder) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def read_checkpoint_bytes(folder: Path) -> bytes:
    """The raw ``state.pt`` of a complete checkpoint, checked against its marker and to load;
    CheckpointError if not."""
    folder = Path(folder)
    try:
        data = (folder / STATE_FILE).read_bytes()
    except OSError as err:
        raise CheckpointError(f"{folder / STATE_FILE}: {err}") from err
    _check_against_marker(folder, data)
    state = decode_checkpoint(data, source=folder)
    match = _STEP_DIR.match(folder.name)
    if match and state["step"] != int(match.group(1)):
        raise CheckpointError(f"{folder}: holds step {state['step']}, not {match.group(1)}")
    return data


def _check_against_marker(folder: Path, data: bytes) -> None:
    """CheckpointError unless ``data`` has the size and sha256 the marker recorded (if it did)."""
    marker = read_marker(folder)
    size, digest = marker.get("state_bytes"), marker.get("state_sha256")
    if size is not None and size != len(data):
        raise CheckpointError(
            f"{folder / STATE_FILE}: {len(data)} bytes, but {size} were written (truncated?)"
        )
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(
            f"{folder / STATE_FILE}: its sha256 differs from the one recorded when it was written "
            "(the bytes changed since)"
        )


def decode_checkpoint(data: bytes, *, source: object = "checkpoint") -> dict[str, Any]:
    """Load checkpoint bytes with ``weights_only=True`` onto the CPU and check their layout."""
    import io

    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # any unpickling/zip error means the file is unusable
        raise CheckpointError(f"{source}: cannot be loaded ({type(err).__name__}: {err})") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: not a checkpoint (a {type(state).__name__})")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{source}: missing {', '.join(missing)}")
    if state["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{source}: format_version {state['format_version']!r} unsupported")
    return state


def newest_loadable_checkpoint(root: Path) -> tuple[Path, bytes] | None:
    """The newest complete checkpoint that loads; unusable newer ones are set aside with a warning.

    A corrupt checkpoint is renamed to ``step-N.corrupt`` (kept for inspection, never resumed
    from, not counted by pruning) so that the run can write ``step-N`` again later.
    """
    for folder in complete_checkpoints(root):
        try:
            return folder, read_checkpoint_bytes(folder)
        except CheckpointError as err:
            set_aside(folder, err)
    return None


def set_aside(folder: Path, err: CheckpointError) -> Path:
    """Rename an unusable checkpoint to ``step-N.corrupt`` (replacing an older one), warning."""
    folder = Path(folder)
    aside = folder.with_name(folder.name + ".corrupt")
    print(
        f"[trainer] WARNING: checkpoint {folder} is unusable ({err}); moved it to "
        f"{aside.name} and falling back to the previous checkpoint",
        file=sys.stderr,
        flush=True,
    )
    shutil.rmtree(aside, ignore_errors=True)
    folder.rename(aside)
    fsync_dir(folder.parent)
    return aside


def step_of(folder: Path) -> int | None:
    """N of a ``step-N`` folder (None for any other name)."""
    match = _STEP_DIR.match(Path(folder).name)
    return int(match.group(1)) if match else None
