"""A small Keras program trained with MultiWorkerMirroredStrategy: the example TFJob.

Each replica reads ``TF_CONFIG`` (set by the Training Operator on a cluster, and by the launcher's
local backend on a laptop): one ``chief`` and ``worker`` tasks, all training in sync — every
step's gradients are all-reduced across them. Without ``TF_CONFIG`` it trains alone.

- Data: ``<data-dir>/train.npz`` (arrays ``x`` [N, F] and ``y`` [N]), or with ``--synthetic``
  (which wins over ``--data-dir``) a generated regression problem (y = x · w + noise), the same
  on every replica. Each replica reads its own shard.
- Model: a tiny Keras MLP, trained by a custom loop with mean-squared error.
- Checkpoints: ``tf.train.CheckpointManager`` every ``--checkpoint-every-steps`` steps into
  ``<output-dir>/checkpoints`` (the chief's; the workers write theirs to a scratch folder that
  they delete, as TensorFlow's multi-worker guide does: saving is a collective). A restarted
  replica resumes from the newest checkpoint and skips the batches it already trained on.
  The folder must be shared by the replicas (a ReadWriteMany volume on a cluster).
- Outputs (the chief only): ``<output-dir>/model/model.keras``, ``summary.json`` (steps,
  world_size, resumed_from_step, final_train_loss, the collective check...) and ``metrics.jsonl``.
- Logs, every replica: ``replicas_in_sync``, the sum of a collective all-reduce (each replica
  adds its replica id + 1, so N replicas give N(N+1)/2) and the final weights' checksum — equal
  on every replica when the all-reduce kept them in sync.

Exit codes: 2 for bad arguments, 3 for bad data (permanent: a restart would not help).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported: no INFO spam

import tensorflow as tf  # noqa: E402 (after the log level)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="model, summary, checkpoints")
    parser.add_argument("--data-dir", help="a folder with train.npz (x: [N, F], y: [N])")
    parser.add_argument("--synthetic", action="store_true", help="generated data (no --data-dir)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64, help="global, over all replicas")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every-steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.synthetic and not args.data_dir:
        parser.error("--data-dir is required (or --synthetic for generated data)")
    for name in ("epochs", "steps_per_epoch", "batch_size", "checkpoint_every_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def log(task: str, message: str) -> None:
    print(f"[tf-example] {task}: {message}", flush=True)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    if args.synthetic:
        rng = np.random.default_rng(args.seed)
        x = rng.normal(size=(4096, 8)).astype(np.float32)
        w = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
        return x, (x @ w + 0.01 * rng.normal(size=4096)).astype(np.float32)
    path = Path(args.data_dir) / "train.npz"
    try:
        with np.load(path) as arrays:
            x, y = arrays["x"].astype(np.float32), arrays["y"].astype(np.float32).reshape(-1)
    except (OSError, KeyError, ValueError) as exc:
        print(f"bad data: {path} must hold arrays x [N, F] and y [N] ({exc})", file=sys.stderr)
        raise SystemExit(3) from exc
    if x.ndim != 2 or len(x) != len(y) or len(x) == 0:
        print(f"bad data: {path}: x {x.shape} and y {y.shape} do not match", file=sys.stderr)
        raise SystemExit(3)
    return x, y


class Task:
    """This replica's place in the cluster, from TF_CONFIG (alone without it)."""

    def __init__(self) -> None:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        task = config.get("task") or {}
        self.type = task.get("type", "chief")
        self.index = int(task.get("index", 0))
        cluster = config.get("cluster") or {}
        # The chief writes; with no chief in the cluster, worker 0 does (TensorFlow's rule).
        self.is_chief = self.type == "chief" or (
            self.type == "worker" and self.index == 0 and "chief" not in cluster
        )

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


def collective_check(strategy: tf.distribute.Strategy) -> float:
    """Each replica adds its replica id + 1 to an all-reduce: N replicas → N(N+1)/2."""

    def contribution() -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        return tf.cast(context.replica_id_in_sync_group + 1, tf.float32)

    @tf.function  # collectives run in graphs (eagerly, TensorFlow warns of their overhead)
    def all_reduce() -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(contribution), axis=None)

    return float(all_reduce())


class Training:
    """One replica's training: the model, its optimizer and step counter, checkpointed together."""

    def __init__(
        self, strategy: tf.distribute.Strategy, task: Task, args: argparse.Namespace, features: int
    ):
        self.strategy, self.task, self.args = strategy, task, args
        self.output = Path(args.output_dir)
        self.output.mkdir(parents=True, exist_ok=True)
        self.total_steps = args.epochs * args.steps_per_epoch
        with strategy.scope():
            self.model = tf.keras.Sequential(
                [
                    tf.keras.Input((features,)),
                    tf.keras.layers.Dense(32, activation="relu"),
                    tf.keras.layers.Dense(1),
                ]
            )
            self.optimizer = tf.keras.optimizers.SGD(args.lr)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step)
        checkpoints = self.output / "checkpoints"
        latest = tf.train.latest_checkpoint(checkpoints)
        self.resumed_from: int | None = None
        if latest:
            checkpoint.restore(latest).expect_partial()
            self.resumed_from = int(self.step.numpy())
            log(str(task), f"resuming from {latest} (step {self.resumed_from})")
        # Saving is a collective: every replica saves, the workers into scratch folders that
        # they delete (TensorFlow's multi-worker recipe); the chief's folder is the real one.
        scratch = checkpoints / f"scratch-{task.type}-{task.index}"
        self.scratch = None if task.is_chief else scratch
        self.manager = tf.train.CheckpointManager(
            checkpoint, str(self.scratch or checkpoints), max_to_keep=2
        )

    def batches(self, x: np.ndarray, y: np.ndarray):
        """This replica's shard of the data, batched, from where a resumed run stopped."""
        args, skip = self.args, self.resumed_from or 0

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            batch = context.get_per_replica_batch_size(args.batch_size)
            data = tf.data.Dataset.from_tensor_slices((x, y[:, None]))
            data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
            data = data.shuffle(len(x), seed=args.seed).repeat()
            return data.batch(batch, drop_remainder=True).skip(skip)

        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    def train(self, x: np.ndarray, y: np.ndarray) -> float:
        """Train to the last step, checkpointing on the way; the last step's loss."""
        model, optimizer, strategy, batch_size = (
            self.model,
            self.optimizer,
            self.strategy,
            self.args.batch_size,
        )

        @tf.function
        def train_step(iterator) -> tf.Tensor:
            def replica_step(features, target):
                with tf.GradientTape() as tape:
                    error = model(features, training=True) - target
                    loss = tf.reduce_sum(tf.square(error)) / batch_size
                gradients = tape.gradient(loss, model.trainable_variables)
                # Under the strategy, apply_gradients all-reduces the gradients first.
                optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
                return loss

            losses = strategy.run(replica_step, args=next(iterator))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        batches, loss = self.batches(x, y), float("nan")
        while int(self.step.numpy()) < self.total_steps:
            loss = float(train_step(batches))
            self.step.assign_add(1)
            done = int(self.step.numpy())
            if done % self.args.checkpoint_every_steps == 0 or done == self.total_steps:
                self.checkpoint(done, loss)
        return loss

    def checkpoint(self, done: int, loss: float) -> None:
        self.manager.save(checkpoint_number=done)
        if self.scratch is not None:
            tf.io.gfile.rmtree(str(self.scratch))
        log(str(self.task), f"step {done}/{self.total_steps} loss {loss:.5f} (checkpoint saved)")
        if self.task.is_chief:
            with open(self.output / "metrics.jsonl", "a") as metrics:
                metrics.write(json.dumps({"step": done, "train_loss": loss}) + "\n")

    def save_model(self) -> None:
        """``model/model.keras``, whole or not at all."""
        folder = self.output / "model"
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".partial-{os.getpid()}.keras"
        self.model.save(partial)
        os.replace(partial, folder / "model.keras")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    tf.keras.utils.set_random_seed(args.seed)  # the same initial weights on every run
    task = Task()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = collective_check(strategy)
    log(str(task), f"replicas_in_sync={strategy.num_replicas_in_sync} collective_sum={total:g}")
    x, y = load_data(args)
    training = Training(strategy, task, args, features=x.shape[1])
    loss = training.train(x, y)
    checksum = sum(float(tf.reduce_sum(v)) for v in training.model.trainable_variables)
    log(str(task), f"done: weights_checksum={checksum:.6f}")
    collective_check(strategy)  # a barrier: every replica has logged before the chief leaves
    if task.is_chief:
        training.save_model()
        summary = {
            "steps": training.total_steps,
            "epochs": args.epochs,
            "world_size": strategy.num_replicas_in_sync,
            "collective_sum": total,
            "resumed_from_step": training.resumed_from,
            "final_train_loss": loss,
            "weights_checksum": checksum,
            "wall_time_s": round(time.monotonic() - started, 3),
            "tensorflow": tf.__version__,
        }
        write_atomic(training.output / "summary.json", json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
