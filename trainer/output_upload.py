"""``--output-uri s3://bucket/prefix``: rank 0 uploads the run's outputs when it ends.

For jobs whose nodes share no volume with the pipeline (the object-store pipeline): the model
(``model/weights.pt``, ``model/model.json``), ``metrics.jsonl``, the TensorBoard event files and,
last, ``summary.json`` go to the URI with the verified S3 sync, so whoever finds ``summary.json``
there finds a complete set beside it. Uploads only add or replace these files: nothing else under
the URI is touched. A finished run started again uploads again (unchanged files are skipped).

Imported only with the flag (it brings the S3 sync and boto3): the trainer still runs with torch
and torchvision alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from components.s3_sync import S3SyncError, sync
from trainer.errors import StorageError

OUTPUT_FILES = ("model/weights.pt", "model/model.json", "metrics.jsonl")
OUTPUT_FOLDERS = ("tensorboard",)
LAST = "summary.json"
"""Uploaded after everything else: its presence in S3 means the outputs are complete."""


def upload_outputs(output_dir: Path, uri: str) -> int:
    """Upload ``output_dir``'s outputs to ``uri``; returns the files sent. Raises StorageError."""
    destination = uri.rstrip("/") + "/"
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".upload-") as tmp:
        staged = Path(tmp)
        _gather(output_dir, staged)
        try:
            first = sync(staged, destination, progress=False)
            _link(output_dir / LAST, staged / LAST)
            last = sync(staged, destination, progress=False)
        except S3SyncError as exc:
            raise StorageError(
                f"--output-uri {uri}: the outputs could not be uploaded ({exc}); the checkpoint "
                "is kept: start the job again to retry the upload"
            ) from exc
    return first.transferred + last.transferred


def _gather(output_dir: Path, staged: Path) -> None:
    """Hard links (copies where links fail) of the outputs, without ``summary.json``."""
    missing = [rel for rel in OUTPUT_FILES if not (output_dir / rel).is_file()]
    if missing:
        raise StorageError(f"--output-uri: {output_dir} lacks {missing} after the export")
    for rel in OUTPUT_FILES:
        _link(output_dir / rel, staged / rel)
    for folder in OUTPUT_FOLDERS:
        root = output_dir / folder
        for path in sorted(root.rglob("*")) if root.is_dir() else []:
            if path.is_file():
                _link(path, staged / path.relative_to(output_dir))


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
