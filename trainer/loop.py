"""The training loop of one rank: :class:`Trainer`.

:meth:`Trainer.run` reads top to bottom: set-up (data, model, resume), the loop of
:meth:`Trainer.train_step` and :meth:`Trainer.after_step`, then :meth:`Trainer.finish`. Every
piece of state the loop changes lives in one :class:`~trainer.loop_state.LoopState`. Beside it:
whether rank 0's checkpoints count, agreed by every rank (:mod:`trainer.durability`); the
progress figures the loop hands over (:mod:`trainer.progress`); what a finished run writes
(:mod:`trainer.summary`).

Resume is bit-exact without saving per-rank generator states: every random choice is a pure
function of ``(seed, epoch, step, rank)`` (see :mod:`trainer.data`, and :meth:`Trainer._reseed`
for dropout), the checkpoint stores the position inside the epoch, and the restarted run skips
the batches already consumed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from kfp_ddp.atomic_files import write_json_atomic
from trainer import checkpoint as ckpt
from trainer.build import (
    DataParts,
    Precision,
    RunPlan,
    TrainingParts,
    build_data,
    build_parts,
    head_only_steps,
    wrap_model,
)
from trainer.checkpointer import Checkpointer
from trainer.config import TrainConfig
from trainer.data import derive_seed
from trainer.distributed import (
    DistEnv,
    StopRequest,
    agree,
    from_rank_0,
    set_collective_timeout,
)
from trainer.divergence import check_divergence
from trainer.durability import CheckpointDurability
from trainer.errors import EXIT_OK, EXIT_SIGTERM, ConfigError
from trainer.export import save_model
from trainer.loop_state import LogWindow, LoopState
from trainer.metrics import metrics_recorder
from trainer.progress import Progress, ProgressTracker, duration
from trainer.resume import check_compatible, load_resume_state, restore
from trainer.run_log import RunLog
from trainer.summary import SUMMARY_FILE, outputs_written_at, run_summary
from trainer.tensorboard_log import NO_TENSORBOARD, NoTensorBoard, tensorboard_log
from trainer.validation import Validator, replicas_in_sync

if TYPE_CHECKING:  # imported only when used: with --checkpoint-uri (the S3 sync), or reports
    from trainer.remote_checkpoints import RemoteCheckpoints
    from trainer.s3_mirror import CheckpointMirror
    from trainer.trainjob_status import StatusReporter

STATUS_URL_VARIABLE = "KUBEFLOW_TRAINER_SERVER_URL"
"""Set by Kubeflow Trainer in every trainer container when it takes progress reports (its
TrainJobStatus feature gate); without it :mod:`trainer.trainjob_status` is not even imported."""


class Trainer:
    """One training run of one rank."""

    def __init__(
        self,
        config: TrainConfig,
        env: DistEnv,
        device: torch.device,
        control_group,
        stop: StopRequest,
        environ: Mapping[str, str] = os.environ,
    ):
        self.cfg, self.env, self.device = config, env, device
        self.group, self.stop, self.environ = control_group, stop, environ
        self.started = time.perf_counter()
        self.output_dir = Path(config.output_dir)
        self.precision = Precision.resolve(config.precision, device)
        self.log = RunLog(self.output_dir, is_main=env.is_main)
        self.checkpointer = Checkpointer(
            config.checkpoint_folder,
            keep=config.keep_checkpoints,
            is_writer=env.is_main,
            log=self.log,
            device=device,
        )
        self.durability = CheckpointDurability(
            self.checkpointer,
            checkpoint_dir=config.checkpoint_folder,
            checkpoint_uri=config.checkpoint_uri,
            upload_timeout_s=config.checkpoint_upload_timeout_s,
            group=control_group,
            log=self.log,
        )
        self.state = LoopState()
        # Prometheus metrics (every rank, --metrics-port) and TensorBoard files (rank 0): no-op
        # recorders when switched off.
        self.metrics = metrics_recorder(
            config.metrics_port, env=env, job=config.metrics_job_label, device=device
        )
        self.metrics.watch_checkpoints(self.checkpointer)
        self.tensorboard: NoTensorBoard = NO_TENSORBOARD
        """Opened when training begins: a refused config or a finished run writes no file."""
        self.mirror: CheckpointMirror | None = None
        """Rank 0's upload of checkpoints to --checkpoint-uri (set up by resume())."""
        self.starting_weights: dict[str, str] | None = None
        """``--init-from``'s weights: where they were read, their sha256 (summary, model card)."""
        self.progress = ProgressTracker()
        """The latest progress figures: reported while training, the final ones in summary.json."""
        self.status: StatusReporter | None = None
        """Rank 0's progress reports to Kubeflow Trainer (set up by begin_loop())."""
        # Set by setup():
        self.inputs: DataParts
        self.plan: RunPlan
        self.parts: TrainingParts
        self.validator: Validator

    # ------------------------------------------------------------------------------ the run
    def run(self) -> int:
        """Train to the end (exit 0) or until a SIGTERM (checkpoint, exit 143)."""
        try:
            return self._run()
        finally:
            self.checkpointer.close()  # a write in flight completes on every exit path
            self.tensorboard.close()
            self.metrics.close()
            if self.mirror is not None:
                self.mirror.close(self.cfg.checkpoint_upload_timeout_s)
            if self.status is not None:
                self.status.close()

    def _run(self) -> int:
        self.setup()
        if self.already_complete():
            return EXIT_OK
        state, plan = self.state, self.plan
        self.begin_loop()
        while state.step < plan.total_steps and not state.stopped:
            for images, labels in self.inputs.data.epoch(state.epoch, state.position):
                self.batch_arrived()
                self.after_step(self.train_step(images, labels))
                if state.stopped or state.step >= plan.total_steps:
                    break
        train_seconds = time.perf_counter() - state.loop_started - state.paused_s
        self.log.close_bar()
        if state.stopped:
            return self._exit_stopped()
        return self.finish(train_seconds)

    def setup(self) -> None:
        """Data, model, optimizer; the resume state loaded into them; DDP around the model."""
        cfg, env = self.cfg, self.env
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.inputs = build_data(cfg, env, self.device, self.group, self.log)
        self.plan = RunPlan.of(cfg, env, self.inputs.data.steps_per_epoch)
        self.parts = build_parts(
            cfg,
            num_classes=len(self.inputs.class_names),
            plan=self.plan,
            device=self.device,
            precision=self.precision,
        )
        self.start_from_weights()
        self.resume()
        wrap_model(cfg, self.parts, env, self.device)
        self.validator = Validator(
            self.inputs.data,
            env=env,
            device=self.device,
            precision=self.precision,
            batch_size=cfg.val_batch_size or 2 * cfg.batch_size,
        )

    def start_from_weights(self) -> None:
        """``--init-from``: the starting weights copied into the fresh model (a resumed run then
        loads its checkpoint over them); the head's rows follow the class names, or a new head
        for another number of classes (``trainer.init_weights``)."""
        cfg = self.cfg
        if not cfg.init_from:
            if cfg.head_epochs:
                self.log.line(
                    f"no starting weights: --head-epochs {cfg.head_epochs} has nothing to keep; "
                    "the whole model trains from the first step"
                )
            return
        from trainer.init_weights import fetch, load_into  # S3 and torchvision's weights API

        # Rank 0 alone reads them (one download or S3 read per job, not one per process) and
        # hands them to every rank; if it cannot, every rank stops with its reason.
        weights = from_rank_0(lambda: fetch(cfg.init_from, cfg.model), self.env, self.group)
        assert weights is not None
        failure: ConfigError | None = None
        change = None
        try:
            change = load_into(
                self.parts.model,
                weights,
                arch=cfg.model,
                num_classes=len(self.inputs.class_names),
                class_names=list(self.inputs.class_names),
            )
        except ConfigError as err:
            failure = err
        # Every rank stops if one could not load them (none should, with the same weights: but
        # none must be left waiting in DDP's first collective until it times out).
        if agree([failure is not None], self.group)[0]:
            raise failure or ConfigError(
                f"--init-from {cfg.init_from!r}: another rank could not load these weights; see "
                "its log"
            )
        self.starting_weights = weights.record()
        head = f"; {change.line()}" if change else ""
        self.log.line(f"weights from {weights.uri} (sha256 {weights.sha256[:16]}){head}")
        alone = head_only_steps(cfg, self.plan)
        if alone:
            self.log.line(
                f"head only: the first {alone} steps ({cfg.head_epochs} epoch(s)) train the "
                "classifier head alone, then the whole model"
            )

    def resume(self) -> None:
        """Continue from the newest complete checkpoint (local or in S3), if there is one."""
        remote = self._remote_checkpoints()
        saved = load_resume_state(
            self.cfg.checkpoint_folder,
            self.env,
            self.group,
            self.log,
            remote,
        )
        if remote is not None:
            # The S3 modules (boto3, ~0.3 s) are imported by the runs that use S3, here and below.
            from trainer.s3_mirror import CheckpointMirror

            self.mirror = CheckpointMirror(remote, keep=self.cfg.keep_checkpoints, log=self.log)
            self.checkpointer.on_written = self.mirror.offer
            self.mirror.catch_up()
        if saved is None:
            return
        check_compatible(saved, self.cfg, self.inputs.class_names, self.log)
        self.state = restore(
            saved, self.parts, cfg=self.cfg, env=self.env, plan=self.plan, log=self.log
        )
        self.state.last_saved = self.state.step

    def _remote_checkpoints(self) -> RemoteCheckpoints | None:
        """Rank 0's view of --checkpoint-uri (None without the flag, and on other ranks)."""
        if not (self.cfg.checkpoint_uri and self.env.is_main):
            return None
        from trainer.remote_checkpoints import RemoteCheckpoints  # S3: see resume

        return RemoteCheckpoints(
            self.cfg.checkpoint_uri,
            self.cfg.checkpoint_folder,
            patience_s=self.cfg.checkpoint_upload_timeout_s,
        )

    def already_complete(self) -> bool:
        """A rerun of a finished training: say so and leave its outputs exactly as they are.

        Finished means: the newest checkpoint is at (or past) the last step, and rank 0's
        summary.json and model/ were written for that step. Rank 0 decides for every rank.
        """
        state = self.state
        finished = False
        if self.env.is_main and state.resumed_from is not None:
            finished = state.step >= self.plan.total_steps and outputs_written_at(
                self.output_dir, state.step
            )
        if not agree([finished], self.group)[0]:
            return False
        self.make_durable()
        self.log.line(
            f"already complete: step {state.step} of {self.plan.total_steps}; model/ and "
            f"summary.json in {self.output_dir} left as they were (to train further, raise "
            "--epochs or --max-steps)"
        )
        if self.env.is_main:
            self.upload_outputs()  # an upload that failed last time; unchanged files are skipped
        self._barrier()
        return True

    def begin_loop(self) -> None:
        """Metrics file, the first log line, the progress bar, TensorBoard and the clocks."""
        cfg, env, plan, state = self.cfg, self.env, self.plan, self.state
        self.log.reset_metrics(state.resumed_from)
        resuming = ""
        if state.resumed_from is not None:
            resuming = (
                f", resuming at step {state.step} (epoch {state.epoch}, batch {state.position})"
            )
        where = str(self.device)
        if self.device.type == "cpu":  # oversubscribed cores show here first
            threads = torch.get_num_threads()
            where += f" ({threads} thread{'s' if threads != 1 else ''})"
        self.log.line(
            f"{cfg.model} on {where} x {env.world_size} ({env.launcher}), precision "
            f"{self.precision.name}, global batch {plan.global_batch}, "
            f"lr {self.parts.optimizer.param_groups[0]['initial_lr']:.4g} "
            f"(warm-up {plan.warmup_steps} steps), {plan.steps_per_epoch} steps/epoch, "
            f"{plan.total_steps} steps" + resuming
        )
        self.log.open_bar(total=plan.total_steps, initial=state.step)
        self.tensorboard = tensorboard_log(
            cfg.tensorboard_path, is_main=env.is_main, device=self.device, log=self.log
        )
        self.status = self._trainjob_status()
        history = state.history
        self.report_progress(
            loss=history.get("train_loss"),
            val_loss=history.get("val_loss"),
            val_accuracy=history.get("val_accuracy"),
        )
        state.first_step = state.step
        state.loop_started = state.mark = time.perf_counter()
        state.window = LogWindow.open(state.paused_s, self.device)
        self.metrics.loop_started(
            step=state.step,
            epoch=state.epoch,
            total_steps=plan.total_steps,
            restarts=state.restarts,
            resumed_from=state.resumed_from,
        )

    def _trainjob_status(self) -> StatusReporter | None:
        """Rank 0's progress reports, where Kubeflow Trainer gave the pod its status server."""
        interval = self.cfg.progress_report_interval_s
        if not (self.env.is_main and interval and self.environ.get(STATUS_URL_VARIABLE)):
            return None
        # Here, not at the top: only a TrainJob's rank 0 reports (the test of it checks that).
        from trainer.trainjob_status import status_reporter

        return status_reporter(
            self.environ,
            interval_s=interval,
            timeout_s=self.cfg.progress_report_timeout_s,
            log=self.log,
        )

    # ----------------------------------------------------------------------------- one step
    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One optimizer step on one batch; the batch's loss (detached, on the device)."""
        parts, cfg = self.parts, self.cfg
        model = parts.train_model
        assert model is not None, "wrap_model() sets the model to train before the first step"
        self._reseed()
        with self.precision.autocast(self.device):
            loss = parts.criterion(model(images), labels)
        parts.optimizer.zero_grad(set_to_none=True)
        parts.scaler.scale(loss).backward()
        if cfg.grad_clip_norm is not None:
            parts.scaler.unscale_(parts.optimizer)
            torch.nn.utils.clip_grad_norm_(parts.model.parameters(), cfg.grad_clip_norm)
        parts.scaler.step(parts.optimizer)
        parts.scaler.update()
        parts.scheduler.step()
        return loss.detach()

    def _reseed(self) -> None:
        """Dropout & co. draw from the global generators: make them a function of the step."""
        step, epoch = self.state.step, self.state.epoch
        torch.manual_seed(derive_seed(self.cfg.seed, "step", epoch, step, self.env.rank))

    def batch_arrived(self) -> None:
        """The next batch is here: the time since the last step was spent waiting for data."""
        state = self.state
        now = time.perf_counter()
        waited, state.mark = now - state.mark, now
        state.open_window.data_wait_s += waited
        self.metrics.batch_ready(waited)

    def after_step(self, loss: torch.Tensor) -> None:
        """Count the step; log, validate, check for a stop and checkpoint when it is time."""
        state, plan, cfg = self.state, self.plan, self.cfg
        state.step += 1
        state.position += 1
        state.open_window.add(loss)
        now = time.perf_counter()
        computed, state.mark = now - state.mark, now
        state.open_window.compute_s += computed
        self.metrics.step_done(
            step=state.step, epoch=state.epoch, images=cfg.batch_size, compute_s=computed
        )
        if state.step == state.first_step + 1:
            self._after_first_step()
        self.log.advance_bar()
        if state.step % cfg.log_interval == 0 or state.step == plan.total_steps:
            self.log_window()
        if state.position == plan.steps_per_epoch:
            self.validate()
            state.epoch, state.position = state.epoch + 1, 0
        elif state.step == plan.total_steps:
            self.validate()  # before the final checkpoint, so its history has the result
        # Every rank must take the same branch below, or the collectives would deadlock: the
        # step count is the same everywhere, and so is what check_ranks() returns.
        if state.step % cfg.stop_check_every_steps == 0 or state.step == plan.total_steps:
            self.check_ranks()
        every = cfg.checkpoint_every_steps
        if state.stopped:
            self.save("SIGTERM")
        elif state.step == plan.total_steps or (every and state.step % every == 0):
            self.save("end" if state.step == plan.total_steps else "periodic")

    def _after_first_step(self) -> None:
        """Compilation and cuDNN autotuning are done: collectives get the shorter timeout."""
        if not set_collective_timeout(self.cfg.collective_timeout_s, self.group):
            self.log.line(
                "WARNING: this torch cannot change a process group's timeout; collectives keep "
                f"--init-timeout-s {self.cfg.init_timeout_s:g}"
            )

    def check_ranks(self) -> None:
        """One small all-reduce: a SIGTERM on any rank, or a failed checkpoint write on rank 0?

        A stop at the very last step just finishes: exporting takes a moment only.
        """
        stop, write_failed = agree([self.stop.requested, self.checkpointer.failed()], self.group)
        if write_failed:
            raise self.durability.write_failure()
        self.state.stopped = stop and self.state.step < self.plan.total_steps

    # ------------------------------------------------------------------ what steps hand off to
    def log_window(self) -> None:
        """One progress line and metrics.jsonl record for the steps since the last one."""
        state, plan, env = self.state, self.plan, self.env
        window = state.window
        assert window is not None
        if env.distributed:  # the loss averaged over all ranks
            dist.all_reduce(window.loss_sum)
            window.loss_sum /= env.world_size
        mean_loss = window.loss_sum.item() / window.steps
        now = time.perf_counter()
        seconds = max(1e-9, now - window.started - (state.paused_s - window.paused_at_start))
        images_per_sec = window.steps * plan.global_batch / seconds
        eta = (plan.total_steps - state.step) * seconds / window.steps
        lr = self.parts.optimizer.param_groups[0]["lr"]
        state.history["train_loss"] = mean_loss
        self.metrics.window_logged(loss=mean_loss, lr=lr, images_per_sec=images_per_sec)
        self.report_progress(
            eta_s=eta, loss=mean_loss, learning_rate=lr, images_per_second=images_per_sec
        )
        self.tensorboard.window(
            step=state.step,
            epoch=state.epoch,
            loss=mean_loss,
            lr=lr,
            images_per_sec=images_per_sec,
            data_wait_s=window.data_wait_s / window.steps,
            compute_s=window.compute_s / window.steps,
        )
        self.log.record(
            {
                "type": "train",
                "step": state.step,
                "epoch": state.epoch,
                "loss": round(mean_loss, 6),
                "lr": lr,
                "images_per_sec": round(images_per_sec, 2),
                "elapsed_s": round(now - self.started, 3),
            }
        )
        self.log.line(
            f"step {state.step}/{plan.total_steps} | epoch {state.epoch} | loss {mean_loss:.4f} | "
            f"lr {lr:.4g} | {images_per_sec:,.0f} img/s | ETA {duration(eta)}"
        )
        check_divergence(
            mean_loss,
            self.parts.model,
            self.group,
            step=state.step,
            lr=self.cfg.lr,
            warmup=plan.warmup_steps,
        )
        state.window = LogWindow.open(state.paused_s, self.device)
        state.window.started = now

    def validate(self) -> None:
        state = self.state
        began = time.perf_counter()
        val_loss, val_accuracy = self.validator(self.parts.model)
        state.last_validated = state.step
        self._paused(time.perf_counter() - began, checkpoint=False)
        if val_loss is None or val_accuracy is None:
            return
        state.history.update(val_loss=val_loss, val_accuracy=val_accuracy)
        self.report_progress(val_loss=val_loss, val_accuracy=val_accuracy)
        self.tensorboard.validation(step=state.step, loss=val_loss, accuracy=val_accuracy)
        self.log.record(
            {
                "type": "val",
                "step": state.step,
                "epoch": state.epoch,
                "val_loss": round(val_loss, 6),
                "val_accuracy": round(val_accuracy, 6),
            }
        )
        self.log.line(
            f"epoch {state.epoch} step {state.step}: val_loss {val_loss:.4f} "
            f"val_acc {val_accuracy:.4f}"
        )

    def report_progress(
        self, *, eta_s: float | None = None, final: bool = False, **figures: float | None
    ) -> Progress:
        """Take the latest figures into the progress; hand the snapshot to the reports (rank 0,
        when Kubeflow Trainer takes them: its thread sends one at most every
        --progress-report-interval-s, the final one at once)."""
        state = self.state
        progress = self.progress.update(
            step=state.step,
            total_steps=self.plan.total_steps,
            eta_s=eta_s,
            final=final,
            epoch=state.epoch,
            **figures,
        )
        if self.status is not None:
            self.status.offer(progress)
        return progress

    def save(self, reason: str) -> None:
        state = self.state
        began = time.perf_counter()
        self.checkpointer.save(state.step, self.checkpoint_state, reason)
        state.last_saved = state.step
        stall = time.perf_counter() - began
        self._paused(stall, checkpoint=True)
        self.tensorboard.checkpoint(step=state.step, stall_s=stall)

    def _paused(self, seconds: float, *, checkpoint: bool) -> None:
        """Validation or a checkpoint held the loop: not training time, nor data wait."""
        self.state.paused_s += seconds
        self.state.mark = time.perf_counter()
        self.metrics.paused(seconds=seconds, checkpoint=checkpoint)

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a restarted run needs, as plain types and tensors."""
        state, parts, cfg = self.state, self.parts, self.cfg
        return {
            "format_version": ckpt.FORMAT_VERSION,
            "step": state.step,
            "epoch": state.epoch,
            "batch_in_epoch": state.position,
            "steps_per_epoch": self.plan.steps_per_epoch,
            "world_size": self.env.world_size,
            "batch_size": cfg.batch_size,
            "model": parts.model.state_dict(),
            "optimizer": parts.optimizer.state_dict(),
            "scheduler": parts.scheduler.state_dict(),
            "scaler": parts.scaler.state_dict(),
            # No generator states: all randomness is derived from these (see module doc).
            "rng": {"scheme": "derive_seed(seed, epoch, step, rank)", "seed": cfg.seed},
            "config": cfg.to_dict(),
            "class_names": self.inputs.class_names,
            "restarts": state.restarts,
            "history": state.history,
        }

    # ------------------------------------------------------------------------------- the end
    def _exit_stopped(self) -> int:
        self.durability.after_sigterm(self.state.step, self.mirror)
        self.log.line(
            f"stopped by SIGTERM at step {self.state.step}; exiting {EXIT_SIGTERM} to be retried"
        )
        return EXIT_SIGTERM

    def finish(self, train_seconds: float) -> int:
        """Validate and checkpoint the last step if not done yet, export, write summary.json."""
        state = self.state
        if state.last_validated != state.step:
            self.validate()
        if state.last_saved != state.step:
            self.save("end")
        self.durability.settle()
        in_sync = replicas_in_sync(self.parts.model, self.env, self.group, self.log)
        if self.env.is_main:
            self.export()
            final = self.report_progress(final=True)  # 100 %: sent now, while the outputs upload
            summary = self.summary(train_seconds, in_sync, final)
            write_json_atomic(self.output_dir / SUMMARY_FILE, summary)
            self.log.line(
                f"done: {state.step} steps, val_acc {summary['val_accuracy']}, "
                f"{summary['images_per_sec']} img/s, wall {summary['wall_time_s']}s"
            )
            self.upload_outputs()
        self.make_durable()
        self._barrier()
        return EXIT_OK

    def upload_outputs(self) -> None:
        """With --output-uri: the outputs to S3, summary.json last (rank 0)."""
        if not self.cfg.output_uri:
            return
        from trainer.output_upload import upload_outputs  # S3: see resume

        started = time.perf_counter()
        sent = upload_outputs(self.output_dir, self.cfg.output_uri)
        self.log.line(
            f"outputs uploaded to {self.cfg.output_uri}: {sent} file(s) sent in "
            f"{time.perf_counter() - started:.1f} s"
        )

    def make_durable(self) -> None:
        """With --checkpoint-uri, the last checkpoint in S3 before the run ends (every rank)."""
        self.durability.make_durable(self.state.step, self.mirror)

    def export(self) -> None:
        """The model folder (rank 0)."""
        save_model(
            self.output_dir / "model",
            self.parts.model.state_dict(),
            arch=self.cfg.model,
            class_names=self.inputs.class_names,
            image_size=self.cfg.image_size,
            mean=list(self.inputs.mean),
            std=list(self.inputs.std),
            starting_weights=self.starting_weights,
        )

    def summary(self, train_seconds: float, in_sync: bool, final: Progress) -> dict[str, Any]:
        return run_summary(
            state=self.state,
            plan=self.plan,
            world_size=self.env.world_size,
            arch=self.cfg.model,
            num_classes=len(self.inputs.class_names),
            precision=self.precision.name,
            device=self.device.type,
            train_seconds=train_seconds,
            wall_seconds=time.perf_counter() - self.started,
            in_sync=in_sync,
            final=final,
            skipped_images=self.inputs.skipped_images,
            starting_weights=self.starting_weights,
            augment=self.inputs.augment,
        )

    def _barrier(self) -> None:
        if self.env.distributed:
            dist.barrier(group=self.group)
