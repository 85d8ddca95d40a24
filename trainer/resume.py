"""Resume: find the newest usable checkpoint, check it fits this run, load it everywhere.

The newest usable checkpoint is the newest complete one in ``--checkpoint-dir`` or, with
``--checkpoint-uri``, in S3 (downloaded into ``--checkpoint-dir`` first), whichever has the higher
step; a corrupt one is set aside and the next newest tried, wherever it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainer import checkpoint as ckpt
from trainer.build import RunPlan, TrainingParts
from trainer.config import TRAJECTORY_SETTINGS, TrainConfig
from trainer.distributed import DistEnv
from trainer.errors import ConfigError, TrainerError
from trainer.loop_state import LoopState
from trainer.run_log import RunLog

if TYPE_CHECKING:
    from trainer.remote_checkpoints import RemoteCheckpoints


def load_resume_state(
    checkpoint_dir: Path,
    env: DistEnv,
    group,
    log: RunLog,
    remote: RemoteCheckpoints | None = None,
) -> dict[str, Any] | None:
    """Rank 0 picks the newest loadable checkpoint and sends its bytes to every rank.

    Broadcasting lets replicas without shared storage resume too, and every rank loads the
    very same bytes with ``weights_only=True``. When rank 0 fails to pick one (S3 unusable),
    it sends its exit code instead, and every rank stops with it.
    """
    data, failure = b"", None
    if env.is_main:
        try:
            found = newest_loadable_checkpoint(checkpoint_dir, remote, log)
        except TrainerError as err:
            if not env.distributed:
                raise
            failure = err
        else:
            if found is not None:
                data = found[1]
    if env.distributed:
        size = torch.tensor([-failure.exit_code if failure else len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0, group=group)
        if failure is not None:
            raise failure
        if size.item() < 0:
            raise _FailedOnRankZero(-int(size.item()))
        buffer = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if env.is_main and data
            else torch.empty(int(size.item()), dtype=torch.uint8)
        )
        if buffer.numel():
            dist.broadcast(buffer, src=0, group=group)
        data = buffer.numpy().tobytes()
    return ckpt.decode_checkpoint(data, source="checkpoint") if data else None


class _FailedOnRankZero(TrainerError):
    def __init__(self, exit_code: int):
        super().__init__(
            "rank 0 could not pick the checkpoint to resume from (its log says why); stopping "
            "with it",
            on_another_rank=True,
        )
        self.exit_code = exit_code


def newest_loadable_checkpoint(
    root: Path, remote: RemoteCheckpoints | None, log: RunLog
) -> tuple[Path, bytes] | None:
    """The newest complete checkpoint, local or remote, that loads: (local folder, bytes).

    A step present in both places is read locally first. A remote one is downloaded into
    ``root`` and then read like a local one; if it is corrupt, its local copy is set aside as
    ``step-N.corrupt`` and its marker in S3 deleted (so it never counts again). Raises
    ConfigError when S3 cannot be listed or read (see :mod:`trainer.remote_checkpoints`).
    """
    if remote is None:
        found = ckpt.newest_loadable_checkpoint(root)
        if found is not None:
            log.line(f"resuming from {found[0]}")
        return found
    # Here, not at the top: the S3 modules (boto3, ~0.3 s) for runs with --checkpoint-uri only.
    from trainer.remote_checkpoints import list_remote, read_remote

    local = {
        step: folder
        for folder in ckpt.complete_checkpoints(root)
        if (step := ckpt.step_of(folder)) is not None  # complete ones are all step-N
    }
    remote_steps = list_remote(remote, log)
    for step in sorted(set(local) | set(remote_steps), reverse=True):
        if step in local:
            try:
                data = ckpt.read_checkpoint_bytes(local[step])
            except ckpt.CheckpointError as err:
                ckpt.set_aside(local[step], err)
            else:
                log.line(f"resuming from {local[step]}")
                return local[step], data
        if step in remote_steps:
            found = read_remote(remote, step, log)
            if found is not None:
                return found
    return None


def check_compatible(
    state: dict[str, Any],
    cfg: TrainConfig,
    class_names: list[str],
    log: RunLog,
) -> None:
    """ConfigError unless the checkpoint trains the same model with the same settings."""
    saved = state["config"]
    checkpoint_dir = cfg.checkpoint_dir
    if saved.get("model") != cfg.model or state.get("class_names") != class_names:
        raise ConfigError(
            f"--checkpoint-dir {checkpoint_dir} holds a run of --model "
            f"{saved.get('model')!r} with classes {state.get('class_names')}; this run uses "
            f"--model {cfg.model!r} with classes {class_names}. Use a new "
            "--checkpoint-dir (or delete the old checkpoints) to start over"
        )
    current = cfg.to_dict()
    changed = [
        f"--{name.replace('_', '-')} {saved[name]!r} -> {current.get(name)!r}"
        for name in TRAJECTORY_SETTINGS
        if name in saved and saved[name] != current.get(name)
    ]
    if changed:
        raise ConfigError(
            f"--checkpoint-dir {checkpoint_dir} holds a run with other training settings "
            f"({'; '.join(changed)}); resuming it would not train what this run asks for. "
            "Use a new --output-dir/--checkpoint-dir (in the pipeline: a new retrain_token), "
            "or run with the checkpoint's settings"
        )
    if state["rng"].get("seed") != cfg.seed:
        log.line(
            f"WARNING: checkpoint used --seed {state['rng'].get('seed')}, this run "
            f"--seed {cfg.seed}: the resumed run is not a bit-exact continuation"
        )


def match_parameter_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Give each optimizer state tensor (momentum, Adam's moments) its parameter's memory layout.

    A checkpoint's tensors come back in the layout they were written in, and the background
    copy writes them contiguous (into its pinned buffers), while a channels_last model's
    weights are not. CUDA's fused SGD and AdamW refuse a step whose parameters, gradients and
    state differ in strides (``check_fast_path_restrictions``), so without this every resumed
    GPU run with the defaults (channels_last, fused) crashed at its first step. The values
    are unchanged: the resumed run stays bit-exact.
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.shape == param.shape
                    and value.stride() != param.stride()
                ):
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def restore(
    state: dict[str, Any],
    parts: TrainingParts,
    *,
    cfg: TrainConfig,
    env: DistEnv,
    plan: RunPlan,
    log: RunLog,
) -> LoopState:
    """Load a checkpoint into ``parts``; the loop state to continue from."""
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    match_parameter_layouts(parts.optimizer)
    parts.scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:
        parts.scaler.load_state_dict(state["scaler"])
    loop = LoopState(
        step=state["step"],
        epoch=state["epoch"],
        position=state["batch_in_epoch"],
        restarts=int(state.get("restarts", 0)) + 1,
        resumed_from=state["step"],
        history=dict(state.get("history", {})),
    )
    if (state.get("world_size"), state.get("batch_size")) != (env.world_size, cfg.batch_size):
        log.line(
            f"WARNING: checkpoint was written with world size {state.get('world_size')} "
            f"and batch {state.get('batch_size')}; now {env.world_size} and "
            f"{cfg.batch_size}: restarting epoch {loop.epoch} from its first batch"
        )
        loop.position = 0
    if loop.position >= plan.steps_per_epoch:
        loop.epoch, loop.position = loop.epoch + 1, 0
    return loop
