"""Set-up: what one run trains with, built from its config.

* :func:`build_data` — this rank's training and validation batches (the one place the trainer
  constructs its input pipeline);
* :func:`build_parts` — the model with its optimizer, LR schedule and gradient scaler;
* :func:`wrap_model` — DDP (and ``torch.compile``) around the model, after a resume has loaded it.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from trainer.config import TrainConfig
from trainer.data import IMAGENET_MEAN, IMAGENET_STD, SyntheticImages
from trainer.distributed import DistEnv, any_rank
from trainer.errors import ConfigError, DataError
from trainer.folder_data import build_folder_data
from trainer.model_shapes import head_parameter_names
from trainer.models import build_model
from trainer.run_log import RunLog


# ------------------------------------------------------------------------------------ precision
@dataclass(frozen=True)
class Precision:
    """The arithmetic of the forward pass: fp32, or autocast to bf16/fp16."""

    name: str
    amp_dtype: torch.dtype | None

    @classmethod
    def resolve(cls, setting: str, device: torch.device) -> Precision:
        """``auto`` is bf16 on CUDA and fp32 on the CPU."""
        name = setting
        if name == "auto":
            name = "bf16" if device.type == "cuda" else "fp32"
        return cls(name, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name))

    def autocast(self, device: torch.device):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.amp_dtype)


# ----------------------------------------------------------------------------------------- data
@dataclass(frozen=True, kw_only=True)
class DataParts:
    """This rank's batches and what the exported model must know about them."""

    data: Any
    """An object with ``steps_per_epoch``, ``epoch(epoch, start_batch)`` and ``validation(n)``."""
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    skipped_images: list[str] = field(default_factory=list)
    """Keys of the unreadable images left out (``--skip-bad-images``)."""
    augment: dict[str, Any] = field(default_factory=dict)
    """The augmentation trained with (``auto``: what the mirror probe decided, and its figures)."""


def build_data(
    cfg: TrainConfig, env: DistEnv, device: torch.device, group, log: RunLog
) -> DataParts:
    """This rank's train/val batches; a data failure on any rank fails every rank."""
    failure: DataError | None = None
    parts = None
    try:
        if cfg.synthetic:
            parts = _synthetic_data(cfg, env, device)
        else:
            parts = _folder_data(cfg, env, device, group, log)
    except DataError as err:
        failure = err
    if any_rank(failure is not None, group):
        raise failure or DataError(
            "another rank could not load the data; see its log", on_another_rank=True
        )
    assert parts is not None
    if parts.data.steps_per_epoch < 1:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is larger than this rank's share of the training "
            f"data (world size {env.world_size}); lower --batch-size or add data"
        )
    return parts


def _synthetic_data(cfg: TrainConfig, env: DistEnv, device: torch.device) -> DataParts:
    data = SyntheticImages(
        num_images=cfg.synthetic_size,
        num_classes=cfg.num_classes,
        image_size=cfg.image_size,
        batch_size=cfg.batch_size,
        world_size=env.world_size,
        rank=env.rank,
        seed=cfg.seed,
        device=device,
        channels_last=bool(cfg.channels_last),
    )
    class_names = [f"class_{i}" for i in range(cfg.num_classes)]
    # Synthetic tensors are already centred: the exported model normalises nothing.
    return DataParts(data=data, class_names=class_names, mean=(0.0,) * 3, std=(1.0,) * 3)


def _folder_data(
    cfg: TrainConfig, env: DistEnv, device: torch.device, group, log: RunLog
) -> DataParts:
    folder = build_folder_data(cfg, env, device, group)
    log.line(f"data: {folder.description}")
    if folder.mirror is not None:
        log.line(folder.mirror.line())
    for warning in folder.warnings:
        log.line(f"WARNING: {warning}")
    return DataParts(
        data=folder.data,
        class_names=folder.class_names,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        skipped_images=[bad.key for bad in folder.skipped],
        augment=folder.mirror.record() if folder.mirror else {"augment": cfg.augment},
    )


# --------------------------------------------------------------------------- model and optimizer
@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """The run's length and batch, fixed once the data is known."""

    steps_per_epoch: int
    total_steps: int
    global_batch: int
    warmup_steps: int

    @classmethod
    def of(cls, cfg: TrainConfig, env: DistEnv, steps_per_epoch: int) -> RunPlan:
        total = cfg.epochs * steps_per_epoch
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        global_batch = cfg.batch_size * env.world_size
        return cls(
            steps_per_epoch=steps_per_epoch,
            total_steps=total,
            global_batch=global_batch,
            warmup_steps=cfg.warmup_for(
                global_batch=global_batch, steps_per_epoch=steps_per_epoch, total_steps=total
            ),
        )


@dataclass(kw_only=True)
class TrainingParts:
    """The model and everything that updates it."""

    model: torch.nn.Module
    """The bare model: its state is checkpointed, validated and exported."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    criterion: torch.nn.Module
    train_model: torch.nn.Module | None = None
    """What the forward pass runs: the model wrapped in DDP / torch.compile (see wrap_model)."""


def warmup_cosine(warmup_steps: int, total_steps: int):
    """LR multiplier: linear warmup from ~0 to 1, then cosine decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def build_parts(
    cfg: TrainConfig,
    *,
    num_classes: int,
    plan: RunPlan,
    device: torch.device,
    precision: Precision,
) -> TrainingParts:
    """A fresh model (seeded by the caller), its optimizer, LR schedule and gradient scaler."""
    memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
    model = build_model(cfg.model, num_classes).to(device, memory_format=memory_format)  # type: ignore[call-overload]  # Module.to takes memory_format; its stubs omit it
    head = head_parameter_names(cfg.model, num_classes) if head_only_steps(cfg, plan) else None
    optimizer = _build_optimizer(cfg, model, plan.global_batch, device, head=head)
    schedule = warmup_cosine(plan.warmup_steps, plan.total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        [
            schedule if group.get("head", True) else after(head_only_steps(cfg, plan), schedule)
            for group in optimizer.param_groups
        ],
    )
    return TrainingParts(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(device.type, enabled=precision.name == "fp16"),
        criterion=torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
    )


def head_only_steps(cfg: TrainConfig, plan: RunPlan) -> int:
    """The steps at the start of the run that train the classifier head alone (--head-epochs,
    with starting weights: a random model has nothing to keep)."""
    if not cfg.init_from:
        return 0
    return min(cfg.head_epochs * plan.steps_per_epoch, plan.total_steps)


def after(start: int, schedule: Callable[[int], float]) -> Callable[[int], float]:
    """``schedule`` from step ``start`` on, 0 before it (a learning rate of 0: no update)."""
    return functools.partial(_after, start, schedule)


def _after(start: int, schedule: Callable[[int], float], step: int) -> float:
    return schedule(step) if step >= start else 0.0


def _build_optimizer(
    cfg: TrainConfig,
    model: torch.nn.Module,
    global_batch: int,
    device: torch.device,
    *,
    head: set[str] | None = None,
) -> torch.optim.Optimizer:
    """Two parameter groups (weights with decay, biases and norms without); with ``head`` (the
    classifier head's names) four: the head's two first, then the rest's, tagged head=False."""
    lr = cfg.base_lr * global_batch / 256
    parts: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        # Biases and normalisation scales are 1-D; weight decay on them only hurts.
        in_head = head is None or name in head
        parts.setdefault((in_head, param.ndim > 1), []).append(param)
    groups: list[dict[str, Any]] = [
        {"params": parts.get((in_head, decays), []), "weight_decay": wd}
        | ({} if head is None else {"head": in_head})
        for in_head in ((True,) if head is None else (True, False))
        for decays, wd in ((True, cfg.weight_decay), (False, 0.0))
    ]
    # Fused kernels on CUDA: one launch for all parameters instead of one per tensor.
    fused = device.type == "cuda"
    if cfg.optimizer == "sgd":
        options = {"fused": True} if fused and _sgd_can_fuse() else {}
        return torch.optim.SGD(
            groups, lr=lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0, **options
        )
    return torch.optim.AdamW(groups, lr=lr, fused=fused or None)


def _sgd_can_fuse() -> bool:
    import inspect

    return "fused" in inspect.signature(torch.optim.SGD).parameters


def wrap_model(cfg: TrainConfig, parts: TrainingParts, env: DistEnv, device: torch.device) -> None:
    """Set ``parts.train_model``: DDP across ranks (and torch.compile); the model in train mode."""
    ddp_model: torch.nn.Module = parts.model
    if env.distributed:
        ddp = torch.nn.parallel.DistributedDataParallel(
            parts.model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
        if cfg.grad_compression != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hooks = {
                "bf16": default_hooks.bf16_compress_hook,
                "fp16": default_hooks.fp16_compress_hook,
            }
            ddp.register_comm_hook(None, hooks[cfg.grad_compression])
        ddp_model = ddp
    # torch.compile of a Module is a Module (OptimizedModule); its stub says any callable.
    parts.train_model = (
        cast(torch.nn.Module, torch.compile(ddp_model)) if cfg.compile else ddp_model
    )
    parts.model.train()
