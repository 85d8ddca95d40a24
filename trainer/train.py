"""``python -m trainer.train``: data-parallel image classification that resumes exactly.

Read top to bottom: :func:`main` parses flags into a :class:`~trainer.config.TrainConfig`,
:func:`run_training` sets up the process group and always tears it down, and :class:`Trainer`
owns the loop (data → model → resume → steps → validation → checkpoints → export).

Resume is bit-exact without saving per-rank generator states: every random choice is a pure
function of ``(seed, epoch, step, rank)`` (see :mod:`trainer.data`, and :meth:`Trainer._reseed`
for dropout), the checkpoint stores the position inside the epoch, and the restarted run skips
the batches already consumed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer import checkpoint as ckpt
from trainer.atomic_files import write_atomic, write_json_atomic
from trainer.config import (
    AUGMENTS,
    CACHE_MODES,
    DEVICES,
    OPTIMIZERS,
    PRECISIONS,
    TRAJECTORY_SETTINGS,
    TrainConfig,
    config_from,
    field_docs,
    flag,
    load_config_file,
)
from trainer.data import (
    CACHE_LIMIT_BYTES,
    CachedImages,
    Normalizer,
    StreamedImages,
    SyntheticImages,
    default_num_workers,
    derive_seed,
    estimated_cache_bytes,
    load_splits,
)
from trainer.distributed import (
    DistEnv,
    StopRequest,
    any_rank,
    configure_cpu_threads,
    destroy_process_group,
    dist_env_from,
    init_process_group,
)
from trainer.errors import (
    EXIT_CONFIG,
    EXIT_DATA,
    EXIT_OK,
    EXIT_SIGTERM,
    ConfigError,
    DataError,
)
from trainer.export import save_model
from trainer.models import build_model

_CHOICES = {
    "optimizer": OPTIMIZERS,
    "precision": PRECISIONS,
    "augment": AUGMENTS,
    "cache_images": CACHE_MODES,
    "device": DEVICES,
}


# ------------------------------------------------------------------------------------------ CLI
def build_arg_parser() -> argparse.ArgumentParser:
    """Flags for every :class:`TrainConfig` field (unset flags stay out of the namespace)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.train",
        description="Data-parallel image classification with exact resume from step checkpoints.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config", type=Path, help="YAML or JSON file of settings; flags override its values"
    )
    docs = field_docs()
    for name, annotation in typing.get_type_hints(TrainConfig).items():
        kind = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
        options: dict[str, Any] = {"help": docs.get(name, "")}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = kind
            options["metavar"] = name.upper()
            if name in _CHOICES:
                options["choices"] = _CHOICES[name]
                options.pop("metavar")
        parser.add_argument(flag(name), dest=name, **options)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse flags (and ``--config``), then train; returns the process exit code."""
    args = vars(build_arg_parser().parse_args(argv))  # exits 2 on malformed flags
    try:
        file_values = load_config_file(args.pop("config")) if "config" in args else {}
        config = config_from(file_values, args)
    except ConfigError as err:
        _error(err)
        return EXIT_CONFIG
    return run_training(config)


def run_training(config: TrainConfig, environ: typing.Mapping[str, str] = os.environ) -> int:
    """Train with ``config`` in this process's role of the job; never leaves a process group."""
    stop = StopRequest()
    stop.install()
    try:
        env = dist_env_from(environ)
        device = _select_device(config, env)
        _configure_backends(config, device, env)
        control_group = init_process_group(env, device, config.dist_timeout_s)
        return Trainer(config, env, device, control_group, stop).run()
    except ConfigError as err:
        _error(err)
        return EXIT_CONFIG
    except DataError as err:
        _error(err)
        return EXIT_DATA
    finally:
        destroy_process_group()
        stop.restore()


def _error(err: Exception) -> None:
    print(f"[trainer] error: {err}", file=sys.stderr, flush=True)


def _select_device(config: TrainConfig, env: DistEnv) -> torch.device:
    cuda = torch.cuda.is_available()
    if config.device == "cuda" and not cuda:
        raise ConfigError("--device cuda but CUDA is not available here; use --device cpu or auto")
    if config.device == "cpu" or not cuda:
        return torch.device("cpu")
    device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _configure_backends(config: TrainConfig, device: torch.device, env: DistEnv) -> None:
    if device.type == "cpu":
        configure_cpu_threads(env)
        if config.channels_last and env.is_main:
            print(
                "[trainer] WARNING: --channels-last on CPU: measured ~10x slower training than "
                "the default memory format with torch 2.13 (CPU); it pays off on CUDA",
                file=sys.stderr,
                flush=True,
            )
    if config.deterministic:
        # Must be set before cuBLAS initialises; harmless on CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    elif device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


# -------------------------------------------------------------------------------------- trainer
def warmup_cosine(warmup_steps: int, total_steps: int):
    """LR multiplier: linear warmup from ~0 to 1, then cosine decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


class Trainer:
    """One training run of one rank."""

    def __init__(
        self,
        config: TrainConfig,
        env: DistEnv,
        device: torch.device,
        control_group,
        stop: StopRequest,
    ):
        self.cfg, self.env, self.device, self.group, self.stop = (
            config,
            env,
            device,
            control_group,
            stop,
        )
        self.started = time.perf_counter()
        self.is_main = env.is_main
        self.output_dir = Path(config.output_dir)
        self.checkpoint_dir = Path(config.checkpoint_dir)  # type: ignore[arg-type]
        precision = config.precision
        if precision == "auto":
            precision = "bf16" if device.type == "cuda" else "fp32"
        self.precision = precision
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.bar = None

    # ---------------------------------------------------------------------------- set-up
    def _build_data(self):
        """This rank's train/val batches; a data failure on any rank fails every rank."""
        cfg, env = self.cfg, self.env
        normalize_args = (self.device, cfg.channels_last)
        failure: DataError | None = None
        data = None
        class_names: list[str] = []
        try:
            if cfg.synthetic:
                class_names = [f"class_{i}" for i in range(cfg.num_classes)]
                data = SyntheticImages(
                    num_images=cfg.synthetic_size,
                    num_classes=cfg.num_classes,
                    image_size=cfg.image_size,
                    batch_size=cfg.batch_size,
                    world_size=env.world_size,
                    rank=env.rank,
                    seed=cfg.seed,
                    device=self.device,
                    channels_last=cfg.channels_last,
                )
            else:
                train, val, class_names = load_splits(
                    cfg.data_dir,  # type: ignore[arg-type]
                    val_fraction=cfg.val_fraction,
                    seed=cfg.seed,
                )
                self.mean, self.std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
                normalize = Normalizer(self.mean, self.std, *normalize_args)
                size = estimated_cache_bytes(len(train) + len(val), cfg.image_size)
                cache = cfg.cache_images == "always" or (
                    cfg.cache_images == "auto" and size <= CACHE_LIMIT_BYTES
                )
                common = dict(
                    image_size=cfg.image_size,
                    augment=cfg.augment,
                    batch_size=cfg.batch_size,
                    rank=env.rank,
                    world_size=env.world_size,
                    seed=cfg.seed,
                    normalize=normalize,
                )
                if cache:
                    data = CachedImages(train, val, **common)
                else:
                    workers = cfg.num_workers
                    if workers is None:
                        workers = default_num_workers(self.device, env.local_world_size)
                    data = StreamedImages(
                        train,
                        val,
                        num_workers=workers,
                        val_batch_size=cfg.val_batch_size,
                        **common,
                    )
                self._log(
                    f"data: {len(train)} train / {len(val)} val images, {len(class_names)} "
                    f"classes, {'cached in memory' if cache else 'streamed from files'}"
                )
        except DataError as err:
            failure = err
        if any_rank(failure is not None, self.group):
            raise failure or DataError("another rank could not load the data; see its log")
        assert data is not None
        if data.steps_per_epoch < 1:
            raise ConfigError(
                f"--batch-size {cfg.batch_size} is larger than this rank's share of the training "
                f"data (world size {env.world_size}); lower --batch-size or add data"
            )
        if cfg.synthetic:
            self.mean, self.std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        return data, class_names

    def _build_optimizer(self, model: torch.nn.Module, global_batch: int):
        cfg = self.cfg
        lr = cfg.base_lr * global_batch / 256
        decay, no_decay = [], []
        for param in model.parameters():
            # Biases and normalisation scales are 1-D; weight decay on them only hurts.
            (no_decay if param.ndim <= 1 else decay).append(param)
        groups = [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0)
        fused = self.device.type == "cuda"
        return torch.optim.AdamW(groups, lr=lr, fused=fused or None)

    # --------------------------------------------------------------------------- resume
    def _load_resume_state(self) -> dict[str, Any] | None:
        """Rank 0 picks the newest loadable checkpoint and sends its bytes to every rank.

        Broadcasting lets replicas without shared storage resume too, and every rank loads the
        very same bytes with ``weights_only=True``.
        """
        data = b""
        if self.is_main:
            found = ckpt.newest_loadable_checkpoint(self.checkpoint_dir)
            if found is not None:
                self._log(f"resuming from {found[0]}")
                data = found[1]
        if self.env.distributed:
            size = torch.tensor([len(data)], dtype=torch.int64)
            dist.broadcast(size, src=0, group=self.group)
            buffer = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                if self.is_main and data
                else torch.empty(int(size.item()), dtype=torch.uint8)
            )
            if buffer.numel():
                dist.broadcast(buffer, src=0, group=self.group)
            data = buffer.numpy().tobytes()
        return ckpt.decode_checkpoint(data, source="checkpoint") if data else None

    def _check_compatible(self, state: dict[str, Any], class_names: list[str]) -> None:
        saved = state["config"]
        if saved.get("model") != self.cfg.model or state.get("class_names") != class_names:
            raise ConfigError(
                f"--checkpoint-dir {self.checkpoint_dir} holds a run of --model "
                f"{saved.get('model')!r} with classes {state.get('class_names')}; this run uses "
                f"--model {self.cfg.model!r} with classes {class_names}. Use a new "
                "--checkpoint-dir (or delete the old checkpoints) to start over"
            )
        current = self.cfg.to_dict()
        changed = [
            f"--{name.replace('_', '-')} {saved[name]!r} -> {current.get(name)!r}"
            for name in TRAJECTORY_SETTINGS
            if name in saved and saved[name] != current.get(name)
        ]
        if changed:
            raise ConfigError(
                f"--checkpoint-dir {self.checkpoint_dir} holds a run with other training settings "
                f"({'; '.join(changed)}); resuming it would not train what this run asks for. "
                "Use a new --output-dir/--checkpoint-dir (in the pipeline: a new retrain_token), "
                "or run with the checkpoint's settings"
            )
        if state["rng"].get("seed") != self.cfg.seed:
            self._log(
                f"WARNING: checkpoint used --seed {state['rng'].get('seed')}, this run "
                f"--seed {self.cfg.seed}: the resumed run is not a bit-exact continuation"
            )

    # --------------------------------------------------------------------------- logging
    def _log(self, message: str) -> None:
        if not self.is_main:
            return
        line = f"[trainer] {message}"
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def _record(self, record: dict[str, Any]) -> None:
        """Append one metrics.jsonl record (rank 0)."""
        if self.is_main:
            with open(self.output_dir / "metrics.jsonl", "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def _reset_metrics(self, resumed_step: int | None) -> None:
        """Start metrics.jsonl afresh, or drop records past the step we resume from."""
        path = self.output_dir / "metrics.jsonl"
        kept = []
        if resumed_step is not None and path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    if json.loads(line).get("step", 0) <= resumed_step:
                        kept.append(line)
        text = "".join(line + "\n" for line in kept)
        write_atomic(path, lambda handle: handle.write(text.encode()))

    # ------------------------------------------------------------------------------ loop
    def _reseed(self, epoch: int, step: int) -> None:
        """Dropout & co. draw from the global generators: make them a function of the step."""
        torch.manual_seed(derive_seed(self.cfg.seed, "step", epoch, step, self.env.rank))

    def _sync_buffers(self, model: torch.nn.Module) -> None:
        """Give every rank rank 0's BatchNorm statistics (each forward updates only its own)."""
        if self.env.distributed:
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)

    @torch.no_grad()
    def _validate(self, model: torch.nn.Module, data) -> tuple[float | None, float | None]:
        self._sync_buffers(model)
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        batch_size = self.cfg.val_batch_size or 2 * self.cfg.batch_size
        for images, labels in data.validation(batch_size):
            with self._autocast():
                logits = model(images)
            totals[0] += F.cross_entropy(logits.float(), labels, reduction="sum")
            totals[1] += (logits.argmax(1) == labels).sum()
            totals[2] += labels.numel()
        if self.env.distributed:
            dist.all_reduce(totals)
        model.train()
        loss_sum, correct, count = totals.tolist()
        if count == 0:
            return None, None
        return loss_sum / count, correct / count

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _weights_digest(self, model: torch.nn.Module) -> str:
        digest = hashlib.sha256()
        for name, tensor in model.state_dict().items():
            digest.update(name.encode())
            digest.update(
                tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
            )
        return digest.hexdigest()

    def _replicas_in_sync(self, model: torch.nn.Module) -> bool:
        """Compare every rank's parameters and buffers bit for bit (sha256 over the state)."""
        if not self.env.distributed:
            return True
        digests: list[str | None] = [None] * self.env.world_size
        dist.all_gather_object(digests, self._weights_digest(model), group=self.group)
        in_sync = len(set(digests)) == 1
        if not in_sync:
            self._log(f"WARNING: replicas diverged; weight digests per rank: {digests}")
        return in_sync

    def run(self) -> int:
        cfg, env = self.cfg, self.env
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        data, class_names = self._build_data()
        steps_per_epoch = data.steps_per_epoch
        total_steps = cfg.epochs * steps_per_epoch
        if cfg.max_steps is not None:
            total_steps = min(total_steps, cfg.max_steps)
        global_batch = cfg.batch_size * env.world_size

        memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
        model = build_model(cfg.model, len(class_names)).to(
            self.device, memory_format=memory_format
        )
        optimizer = self._build_optimizer(model, global_batch)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmup_cosine(cfg.warmup_steps, total_steps)
        )
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

        step = epoch = position = restarts = 0
        resumed_from: int | None = None
        state = self._load_resume_state()
        history: dict[str, Any] = {}
        if state is not None:
            self._check_compatible(state, class_names)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            if state["scaler"]:
                scaler.load_state_dict(state["scaler"])
            step, epoch, position = state["step"], state["epoch"], state["batch_in_epoch"]
            restarts = int(state.get("restarts", 0)) + 1
            resumed_from = step
            history = dict(state.get("history", {}))
            if (state.get("world_size"), state.get("batch_size")) != (
                env.world_size,
                cfg.batch_size,
            ):
                self._log(
                    f"WARNING: checkpoint was written with world size {state.get('world_size')} "
                    f"and batch {state.get('batch_size')}; now {env.world_size} and "
                    f"{cfg.batch_size}: restarting epoch {epoch} from its first batch"
                )
                position = 0
            if position >= steps_per_epoch:
                epoch, position = epoch + 1, 0
            del state
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._reset_metrics(resumed_from)

        ddp_model: torch.nn.Module = model
        if env.distributed:
            ddp_model = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                gradient_as_bucket_view=True,
            )
        train_model = torch.compile(ddp_model) if cfg.compile else ddp_model
        criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        model.train()

        self._log(
            f"{cfg.model} on {self.device} x {env.world_size} ({env.launcher}), precision "
            f"{self.precision}, global batch {global_batch}, "
            f"lr {optimizer.param_groups[0]['lr']:.4g}, {steps_per_epoch} steps/epoch, "
            f"{total_steps} steps"
            + (
                f", resuming at step {step} (epoch {epoch}, batch {position})"
                if resumed_from is not None
                else ""
            )
        )
        if self.is_main and sys.stderr.isatty() and step < total_steps:
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self.bar = tqdm(total=total_steps, initial=step, unit="step", dynamic_ncols=True)

        def checkpoint_state() -> dict[str, Any]:
            return {
                "format_version": ckpt.FORMAT_VERSION,
                "step": step,
                "epoch": epoch,
                "batch_in_epoch": position,
                "steps_per_epoch": steps_per_epoch,
                "world_size": env.world_size,
                "batch_size": cfg.batch_size,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                # No generator states: all randomness is derived from these (see module doc).
                "rng": {"scheme": "derive_seed(seed, epoch, step, rank)", "seed": cfg.seed},
                "config": cfg.to_dict(),
                "class_names": class_names,
                "restarts": restarts,
                "history": history,
            }

        def save(reason: str) -> None:
            nonlocal last_saved, paused_s
            began = time.perf_counter()
            if self.is_main:
                folder = ckpt.save_checkpoint(
                    self.checkpoint_dir, step, checkpoint_state(), keep=cfg.keep_checkpoints
                )
                self._log(f"checkpoint {folder} ({reason}, {time.perf_counter() - began:.1f}s)")
            last_saved = step
            paused_s += time.perf_counter() - began

        def validate() -> None:
            nonlocal last_validated, paused_s
            began = time.perf_counter()
            val_loss, val_accuracy = self._validate(model, data)
            last_validated = step
            paused_s += time.perf_counter() - began
            if val_accuracy is None:
                return
            history.update(val_loss=val_loss, val_accuracy=val_accuracy)
            self._record(
                {
                    "type": "val",
                    "step": step,
                    "epoch": epoch,
                    "val_loss": round(val_loss, 6),  # type: ignore[arg-type]
                    "val_accuracy": round(val_accuracy, 6),
                }
            )
            self._log(
                f"epoch {epoch} step {step}: val_loss {val_loss:.4f} val_acc {val_accuracy:.4f}"
            )

        last_saved = step if resumed_from is not None else -1
        last_validated = -1
        paused_s = 0.0  # time spent in validation and checkpoints (not counted as training time)
        first_step = step
        loop_started = window_started = time.perf_counter()
        window_paused, window_steps = 0.0, 0
        window_loss = torch.zeros((), device=self.device)
        stopped = False

        while step < total_steps and not stopped:
            for images, labels in data.epoch(epoch, position):
                self._reseed(epoch, step)
                with self._autocast():
                    loss = criterion(train_model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if cfg.grad_clip_norm is not None:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip_norm)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                step += 1
                position += 1
                window_loss += loss.detach()
                window_steps += 1
                if self.bar is not None:
                    self.bar.update(1)

                if step % cfg.log_interval == 0 or step == total_steps:
                    if env.distributed:  # the loss averaged over all ranks
                        dist.all_reduce(window_loss)
                        window_loss /= env.world_size
                    mean_loss = window_loss.item() / window_steps
                    now = time.perf_counter()
                    seconds = max(1e-9, now - window_started - (paused_s - window_paused))
                    images_per_sec = window_steps * global_batch / seconds
                    eta = (total_steps - step) * seconds / window_steps
                    lr = optimizer.param_groups[0]["lr"]
                    history["train_loss"] = mean_loss
                    self._record(
                        {
                            "type": "train",
                            "step": step,
                            "epoch": epoch,
                            "loss": round(mean_loss, 6),
                            "lr": lr,
                            "images_per_sec": round(images_per_sec, 2),
                            "elapsed_s": round(now - self.started, 3),
                        }
                    )
                    self._log(
                        f"step {step}/{total_steps} | epoch {epoch} | loss {mean_loss:.4f} | "
                        f"lr {lr:.4g} | {images_per_sec:,.0f} img/s | ETA {_duration(eta)}"
                    )
                    window_loss.zero_()
                    window_started, window_paused, window_steps = now, paused_s, 0

                if position == steps_per_epoch:
                    validate()
                    epoch, position = epoch + 1, 0
                elif step == total_steps:
                    validate()  # before the final checkpoint, so its history has the result

                # Every rank must take the same branch below, or the collectives would deadlock.
                # A stop at the very last step just finishes: exporting takes a moment only.
                stopped = any_rank(self.stop.requested, self.group) and step < total_steps
                every = cfg.checkpoint_every_steps
                if stopped:
                    save("SIGTERM")
                elif step == total_steps or (every and step % every == 0):
                    save("end" if step == total_steps else "periodic")
                if stopped or step >= total_steps:
                    break

        train_seconds = time.perf_counter() - loop_started - paused_s
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if stopped:
            self._barrier()  # rank 0's checkpoint is complete before any rank exits
            self._log(f"stopped by SIGTERM at step {step}; exiting {EXIT_SIGTERM} to be retried")
            return EXIT_SIGTERM

        if last_validated != step:
            validate()
        if last_saved != step:
            save("end")
        in_sync = self._replicas_in_sync(model)
        if self.is_main:
            save_model(
                self.output_dir / "model",
                model.state_dict(),
                arch=cfg.model,
                class_names=class_names,
                image_size=cfg.image_size,
                mean=list(self.mean),
                std=list(self.std),
            )
            trained = step - first_step
            summary = {
                "final_train_loss": history.get("train_loss"),
                "val_accuracy": history.get("val_accuracy"),
                "val_loss": history.get("val_loss"),
                "steps": step,
                "epochs": step // steps_per_epoch,
                "steps_per_epoch": steps_per_epoch,
                "world_size": env.world_size,
                "global_batch_size": global_batch,
                "wall_time_s": round(time.perf_counter() - self.started, 3),
                "train_time_s": round(train_seconds, 3),
                "images_per_sec": round(trained * global_batch / max(train_seconds, 1e-9), 2)
                if trained
                else None,
                "resumed_from_step": resumed_from,
                "restarts": restarts,
                "arch": cfg.model,
                "num_classes": len(class_names),
                "precision": self.precision,
                "device": self.device.type,
                "replicas_in_sync": in_sync,
            }
            write_json_atomic(self.output_dir / "summary.json", summary)
            self._log(
                f"done: {step} steps, val_acc {summary['val_accuracy']}, "
                f"{summary['images_per_sec']} img/s, wall {summary['wall_time_s']}s"
            )
        self._barrier()
        return EXIT_OK

    def _barrier(self) -> None:
        if self.env.distributed:
            dist.barrier(group=self.group)


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


if __name__ == "__main__":
    sys.exit(main())
