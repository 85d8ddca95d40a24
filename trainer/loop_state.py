"""The training loop's state, in one place: what a step changes and what a checkpoint records."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass(kw_only=True)
class LogWindow:
    """The steps since the last progress line: their summed loss and their wall time."""

    started: float
    """perf_counter() when the window opened."""
    paused_at_start: float
    """LoopState.paused_s when the window opened (pauses inside it are not training time)."""
    loss_sum: torch.Tensor
    """Summed on the device: reading it every step would synchronise the GPU."""
    steps: int = 0
    data_wait_s: float = 0.0
    """Seconds the loop waited for the window's batches."""
    compute_s: float = 0.0
    """Seconds from each batch to the end of its step (host time)."""

    @classmethod
    def open(cls, paused_s: float, device: torch.device) -> LogWindow:
        return cls(
            started=time.perf_counter(),
            paused_at_start=paused_s,
            loss_sum=torch.zeros((), device=device),
        )

    def add(self, loss: torch.Tensor) -> None:
        self.loss_sum += loss
        self.steps += 1


@dataclass(kw_only=True)
class LoopState:
    """Where the run stands. ``step``, ``epoch``, ``position``, ``restarts`` and ``history`` go
    into every checkpoint; the rest is this process's bookkeeping."""

    step: int = 0
    """Optimizer steps taken since the run began (all restarts together)."""
    epoch: int = 0
    position: int = 0
    """Batches of ``epoch`` already trained (where a resumed run continues)."""
    restarts: int = 0
    """How often the run was resumed from a checkpoint."""
    resumed_from: int | None = None
    """The step this process resumed from (None: it started afresh)."""
    history: dict[str, float] = field(default_factory=dict)
    """The latest train_loss / val_loss / val_accuracy."""
    first_step: int = 0
    """The step this process started at (its throughput counts the steps after it)."""
    last_saved: int = -1
    last_validated: int = -1
    paused_s: float = 0.0
    """Seconds spent validating and checkpointing: not training time."""
    loop_started: float = 0.0
    """perf_counter() when this process's loop began."""
    stopped: bool = False
    """A SIGTERM reached some rank: checkpoint, then exit to be retried."""
    window: LogWindow | None = None
    mark: float = 0.0
    """perf_counter() at the last step boundary: what splits a step into data wait and compute."""

    @property
    def open_window(self) -> LogWindow:
        """The log window the steps count into (the loop opens it before the first step)."""
        if self.window is None:
            raise RuntimeError("the log window is opened when the training loop starts")
        return self.window
