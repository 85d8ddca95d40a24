"""``--tensorboard-dir``: rank 0 writes the training scalars as TensorBoard event files.

Written with the official writer, ``torch.utils.tensorboard.SummaryWriter`` (imported only when
rank 0 writes; default folder ``OUTPUT_DIR/tensorboard``, which ``--output-uri`` uploads with the
model). The scalars are those of the metrics endpoint (:mod:`trainer.metrics`), by optimizer
step: ``train/loss``, ``train/learning_rate``, ``train/images_per_second``, ``train/epoch``,
``time/data_wait_seconds`` and ``time/compute_seconds`` (per step, averaged over the log window),
``time/checkpoint_stall_seconds``, ``val/loss``, ``val/accuracy``, and on CUDA
``gpu/memory_allocated_bytes`` and ``gpu/memory_peak_bytes``.

Point TensorBoard at the folder (``tensorboard --logdir OUTPUT_DIR/tensorboard``), or at its S3
copy; a resumed run appends a new event file to the same folder, and TensorBoard shows the steps
after the checkpoint again from the newest file.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import torch


class NoTensorBoard:
    """No event files (``--tensorboard-dir none``, and every rank but 0)."""

    def window(
        self,
        *,
        step: int,
        epoch: int,
        loss: float,
        lr: float,
        images_per_sec: float,
        data_wait_s: float,
        compute_s: float,
    ) -> None:
        pass

    def validation(self, *, step: int, loss: float, accuracy: float) -> None:
        pass

    def checkpoint(self, *, step: int, stall_s: float) -> None:
        pass

    def close(self) -> None:
        pass


NO_TENSORBOARD = NoTensorBoard()


class TensorBoardLog(NoTensorBoard):
    """Rank 0's event files in ``folder``."""

    def __init__(self, folder: Path, device: torch.device):
        self.writer = _summary_writer(folder)
        self.device = device

    def window(self, *, step, epoch, loss, lr, images_per_sec, data_wait_s, compute_s) -> None:
        scalars = {
            "train/loss": loss,
            "train/learning_rate": lr,
            "train/images_per_second": images_per_sec,
            "train/epoch": epoch,
            "time/data_wait_seconds": data_wait_s,
            "time/compute_seconds": compute_s,
        }
        if self.device.type == "cuda":
            scalars["gpu/memory_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            scalars["gpu/memory_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        self._add(scalars, step)

    def validation(self, *, step: int, loss: float, accuracy: float) -> None:
        self._add({"val/loss": loss, "val/accuracy": accuracy}, step)

    def checkpoint(self, *, step: int, stall_s: float) -> None:
        self._add({"time/checkpoint_stall_seconds": stall_s}, step)

    def _add(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()  # flushes the events still queued


def summary_writer_class() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, imported without TensorFlow.

    TensorBoard's writer uses TensorFlow's file layer when TensorFlow is installed (seconds of
    import and log noise); ``tensorboard.compat.notf`` is TensorBoard's own switch to its
    built-in stand-in, which writes local (and S3) folders alike.
    """
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


def _summary_writer(folder: Path) -> Any:
    """``SummaryWriter(folder)``, without importing TensorFlow (:func:`summary_writer_class`)."""
    return summary_writer_class()(log_dir=str(folder), flush_secs=30)


def tensorboard_log(
    folder: Path | None, *, is_main: bool, device: torch.device, log
) -> NoTensorBoard:
    """Rank 0's :class:`TensorBoardLog` in ``folder``; :data:`NO_TENSORBOARD` for other ranks,
    without a folder, or (with a warning) where the ``tensorboard`` package is missing."""
    if folder is None or not is_main:
        return NO_TENSORBOARD
    try:
        return TensorBoardLog(folder, device)
    except ImportError as err:
        log.line(
            f"WARNING: no TensorBoard files in {folder}: {err} (pip install tensorboard, or pass "
            "--tensorboard-dir none)"
        )
        return NO_TENSORBOARD
