"""A training whose loss went to nan or inf stops, naming the learning rate.

It used to run on to its last step (every later loss ``nan``, the weights ``nan``), export that
model and fail only in the pipeline's training step, whose metrics KFP cannot hold ("Fail to
serialize NaN"), or in the evaluation: the whole training's time spent on nothing.

A window's mean loss (the same on every rank: it is all-reduced) that is not finite is not yet
the end: with fp16's GradScaler a step whose gradients overflow is skipped and the weights stay
as they were. The run stops when the weights themselves are no longer finite on any rank (one
all-reduce of a flag, only after such a window), with a ConfigError (exit 2: permanent, a retry
would diverge again from the same checkpoint and settings).
"""

from __future__ import annotations

import math

import torch

from trainer.distributed import agree
from trainer.errors import ConfigError


def weights_are_finite(model: torch.nn.Module) -> bool:
    """Whether every parameter of ``model`` is finite (no nan, no inf)."""
    with torch.no_grad():
        return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def check_divergence(
    mean_loss: float, model: torch.nn.Module, group, *, step: int, lr: float | None, warmup: int
) -> None:
    """Raise ConfigError when ``mean_loss`` is not finite and neither are the weights (on any
    rank). A collective after such a loss: every rank calls it with the same ``mean_loss``."""
    if math.isfinite(mean_loss):
        return
    if not agree([not weights_are_finite(model)], group)[0]:
        return  # an overflow the GradScaler skipped: the weights are intact
    now = "its default" if lr is None else f"{lr:g}"
    raise ConfigError(
        f"the training diverged: the loss is {mean_loss} at step {step} and the weights are no "
        f"longer finite; lower --lr (in the pipeline lr; now {now}), e.g. to a tenth, or warm "
        f"it up over more steps (--warmup-steps, now {warmup}; in the pipeline trainer_args)"
    )
