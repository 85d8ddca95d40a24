"""``--metrics-port``: every rank serves its training metrics for Prometheus while it trains.

Local rank k listens on ``PORT + k`` (all addresses), with the official ``prometheus_client``
(imported only when the flag is on) and a registry of its own. Every series carries the labels
``rank``, ``node_rank`` and ``job`` (the training job's name: ``--metrics-job``); the
PodMonitor/ServiceMonitor the launcher renders sets ``honorLabels`` so that this ``job`` stays.

The loop reports to a :class:`MetricsRecorder` through a few named methods (:data:`NO_METRICS`
when the flag is off: the same methods doing nothing). Updating a metric costs well under a
microsecond; the HTTP server runs in its own thread, so a scrape still answers while the
training thread waits in a collective for a lost peer, and ``seconds_since_last_step``, computed
at scrape time, keeps growing: what the hang alert watches.

Step time is split on the host: *data wait* is the time the loop waited for the next batch,
*compute* the time from that batch to the step's end (on CUDA the kernels run asynchronously, so
a GPU-bound step shows its time wherever the host next waits for the GPU).
"""

from __future__ import annotations

import importlib.util
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from trainer.checkpointer import Checkpointer
    from trainer.distributed import DistEnv

PREFIX = "kfp_ddp_train_"
"""Every series' name begins with it (the alert rules and the README name them)."""
LABELS = ("rank", "node_rank", "job")


class NoMetrics:
    """The recorder when ``--metrics-port`` is 0: every method does nothing."""

    port: int | None = None

    def loop_started(
        self, *, step: int, epoch: int, total_steps: int, restarts: int, resumed_from: int | None
    ) -> None:
        pass

    def batch_ready(self, waited_s: float) -> None:
        pass

    def step_done(self, *, step: int, epoch: int, images: int, compute_s: float) -> None:
        pass

    def window_logged(self, *, loss: float, lr: float, images_per_sec: float) -> None:
        pass

    def paused(self, *, seconds: float, checkpoint: bool) -> None:
        pass

    def watch_checkpoints(self, checkpointer: Checkpointer) -> None:
        pass

    def close(self) -> None:
        pass


NO_METRICS = NoMetrics()


class MetricsRecorder(NoMetrics):
    """The metrics of one rank, and the HTTP server that serves them."""

    def __init__(self, *, port: int, env: DistEnv, job: str, device: torch.device):
        from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

        self.registry = CollectorRegistry()
        values = {
            "rank": str(env.rank),
            "node_rank": str(env.rank // max(1, env.local_world_size)),
            "job": job,
        }

        def gauge(name: str, doc: str) -> Any:
            return Gauge(PREFIX + name, doc, LABELS, registry=self.registry).labels(**values)

        def counter(name: str, doc: str) -> Any:
            return Counter(PREFIX + name, doc, LABELS, registry=self.registry).labels(**values)

        ProcessCollector(registry=self.registry)  # CPU seconds, resident memory, open files
        self.step = gauge("step", "Optimizer steps completed (all restarts together)")
        self.total_steps = gauge("total_steps", "Optimizer steps the run will take")
        self.epoch = gauge("epoch", "The current epoch (0-based)")
        self.samples = counter("samples", "Images this rank trained on since it started")
        self.loss = gauge("loss", "Training loss, mean over the ranks and the last log window")
        self.learning_rate = gauge("learning_rate", "Learning rate of the last step")
        self.images_per_second = gauge(
            "images_per_second", "Training throughput of all ranks over the last log window"
        )
        self.data_wait = counter("data_wait_seconds", "Seconds the loop waited for batches")
        self.compute = counter("compute_seconds", "Seconds from a batch to the end of its step")
        self.stall = counter(
            "stall_seconds", "Seconds training stood still for checkpoints and validation"
        )
        self.checkpoint_stall = gauge(
            "checkpoint_stall_seconds", "Seconds the last checkpoint held the training loop"
        )
        self.restarts = gauge("restarts", "Times the run was resumed from a checkpoint")
        self.resumed_from = gauge(
            "resumed_from_step", "The step this process resumed from (-1: started afresh)"
        )
        self.last_step_at = time.monotonic()
        gauge(
            "seconds_since_last_step",
            "Seconds since this rank completed a step (or started): grows while it hangs",
        ).set_function(lambda: time.monotonic() - self.last_step_at)
        self._checkpoint_seconds = gauge(
            "checkpoint_save_seconds", "Seconds rank 0 took to write its last checkpoint"
        )
        self.resumed_from.set(-1)
        if device.type == "cuda":
            self._watch_gpu(gauge, device)
        self.server, self.port = _serve(port + env.local_rank, self.registry)

    def _watch_gpu(self, gauge, device: torch.device) -> None:
        import torch

        gauge("gpu_memory_allocated_bytes", "GPU memory held by tensors").set_function(
            lambda: torch.cuda.memory_allocated(device)
        )
        gauge("gpu_memory_peak_bytes", "Peak GPU memory held by tensors").set_function(
            lambda: torch.cuda.max_memory_allocated(device)
        )
        if importlib.util.find_spec("pynvml") is not None:  # nvidia-ml-py
            gauge("gpu_utilization_percent", "GPU busy share (NVML)").set_function(
                lambda: torch.cuda.utilization(device)
            )

    # -- what the loop reports ---------------------------------------------------------------
    def loop_started(self, *, step, epoch, total_steps, restarts, resumed_from) -> None:
        self.step.set(step)
        self.epoch.set(epoch)
        self.total_steps.set(total_steps)
        self.restarts.set(restarts)
        self.resumed_from.set(-1 if resumed_from is None else resumed_from)
        self.last_step_at = time.monotonic()

    def batch_ready(self, waited_s: float) -> None:
        self.data_wait.inc(waited_s)

    def step_done(self, *, step: int, epoch: int, images: int, compute_s: float) -> None:
        self.last_step_at = time.monotonic()
        self.compute.inc(compute_s)
        self.step.set(step)
        self.epoch.set(epoch)
        self.samples.inc(images)

    def window_logged(self, *, loss: float, lr: float, images_per_sec: float) -> None:
        self.loss.set(loss)
        self.learning_rate.set(lr)
        self.images_per_second.set(images_per_sec)

    def paused(self, *, seconds: float, checkpoint: bool) -> None:
        """Validation or a checkpoint held the loop: neither data wait nor compute."""
        self.stall.inc(seconds)
        if checkpoint:
            self.checkpoint_stall.set(seconds)

    def watch_checkpoints(self, checkpointer: Checkpointer) -> None:
        self._checkpoint_seconds.set_function(lambda: checkpointer.last_write_s or 0.0)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _serve(port: int, registry) -> tuple[Any, int | None]:
    """Start the HTTP server on ``port``; (None, None) with a warning when it cannot listen."""
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr="0.0.0.0", registry=registry)
    except (OSError, OverflowError) as err:
        print(
            f"[trainer] WARNING: --metrics-port: cannot listen on port {port} ({err}); this rank "
            "serves no metrics (give each process on a machine its own port range)",
            flush=True,
        )
        return None, None
    return server, port


def metrics_recorder(port: int, *, env: DistEnv, job: str, device: torch.device) -> NoMetrics:
    """The recorder of ``--metrics-port port``: serving metrics, or :data:`NO_METRICS` for 0."""
    if not port:
        return NO_METRICS
    return MetricsRecorder(port=port, env=env, job=job, device=device)
