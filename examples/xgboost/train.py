"""A gradient-boosted tree classifier trained by XGBoost's collective: the example XGBoost job.

Every process runs this program; its place in the job comes from the environment:

- Kubeflow Trainer v2 (the ``xgboost-distributed`` runtime): ``DMLC_TRACKER_URI`` (the rank-0
  pod's host), ``DMLC_TRACKER_PORT``, ``DMLC_TASK_ID`` (the rank) and ``DMLC_NUM_WORKER``.
- Training Operator v1.9 (an XGBoostJob: a Master and Workers): ``MASTER_ADDR`` (master-0's
  host), ``MASTER_PORT`` (the tracker's port), ``RANK`` (the master 0, the workers 1..) and
  ``WORLD_SIZE``. The launcher's XGBoostJob also sets the DMLC variables from them (its pods'
  command), so this set is read only in an XGBoostJob made otherwise.

The DMLC variables win when both sets are there; with neither it trains alone. Rank 0 runs
XGBoost's tracker (bound to every interface, on the given port) and every rank, rank 0 too,
joins it; from then on each boosting round's histograms are all-reduced, so the trees are the
same on every rank.

- Data: ``<data-dir>/train.npz`` (arrays ``x`` [N, F] and integer labels ``y`` [N]) when it is
  there, else a data set that ships with scikit-learn (``--dataset``: ``breast_cancer``, binary,
  or ``wine`` / ``digits``, multiclass). A stratified 80/20 split with a fixed ``--seed`` gives
  every rank the same held-out set; each rank trains on its own shard of the rest (rows
  ``rank::world_size``).
- Model: ``hist`` trees, ``binary:logistic`` or ``multi:softprob``.
- Checkpoints: rank 0 saves the booster every ``--checkpoint-every-steps`` rounds (and after the
  last) as ``<output-dir>/checkpoints/round-<N>.json`` and keeps the newest two. At start rank 0
  loads the newest that reads (a corrupt one: the one before it) and broadcasts it, so every
  rank resumes from the same round; only rank 0 needs the output folder.
- Outputs (rank 0 only, each written whole or not at all): ``<output-dir>/model/model.json``,
  ``summary.json`` (rounds, world_size, resumed_from_round, test accuracy and log loss, the
  collective check...) and ``metrics.jsonl`` (the held-out metrics of every round).
- Logs, every rank: where the data came from and the shard's size, the sum of a collective
  all-reduce (each rank adds rank + 1, so N ranks give N(N+1)/2), the test accuracy and the final
  model's checksum — equal on every rank when the all-reduce kept them in sync.

Exit codes: 2 for bad arguments (flags or the environment), 3 for bad data (permanent: a restart
would not help).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import xgboost as xgb
from sklearn import datasets
from sklearn.model_selection import train_test_split
from xgboost import collective
from xgboost.tracker import RabitTracker

DATASETS = {
    "breast_cancer": datasets.load_breast_cancer,
    "wine": datasets.load_wine,
    "digits": datasets.load_digits,
}
KEEP_CHECKPOINTS = 2
TRACKER_WAIT_S = 300  # how long a rank waits for the tracker's host name to resolve


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="model, summary, checkpoints")
    parser.add_argument(
        "--data-dir", help="a folder with train.npz (x: [N, F], y: [N]); used when it has one"
    )
    parser.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        default="breast_cancer",
        help="scikit-learn's data set, when --data-dir has no train.npz",
    )
    parser.add_argument("--epochs", type=int, default=50, help="boosting rounds")
    parser.add_argument("--lr", type=float, default=0.3, help="the learning rate (eta)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="accepted and ignored: XGBoost trains on the whole shard every round",
    )
    parser.add_argument(
        "--checkpoint-every-steps",
        type=int,
        default=10,
        help="rounds between checkpoints (0: only after the last round)",
    )
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="the split's and XGBoost's seed")
    args = parser.parse_args(argv)
    for name in ("epochs", "max_depth"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.checkpoint_every_steps < 0:
        parser.error("--checkpoint-every-steps must be 0 or more")
    if not args.lr > 0:
        parser.error("--lr must be positive")
    return args


def log(place: Place, message: str) -> None:
    print(f"[xgb-example] {place}: {message}", flush=True)


def fail(code: int, message: str) -> NoReturn:
    """Stop with ``message`` on stderr: 2 for bad arguments, 3 for bad data."""
    kind = "bad arguments" if code == 2 else "bad data"
    print(f"[xgb-example] {kind}: {message}", file=sys.stderr)
    raise SystemExit(code)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class Place:
    """This process's place in the job: its rank, the world's size and where the tracker is."""

    rank: int = 0
    world_size: int = 1
    tracker_host: str | None = None
    tracker_port: int | None = None
    source: str = "no cluster environment"

    def __str__(self) -> str:
        return f"rank {self.rank}/{self.world_size}"


DMLC_VARS = ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER")
OPERATOR_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def place_from_env(env: Mapping[str, str]) -> Place:
    """Trainer v2's DMLC_* variables, else the Training Operator's, else alone."""
    if any(env.get(name) for name in DMLC_VARS):
        names, source = DMLC_VARS, "Trainer v2 (DMLC_*)"
    elif env.get("MASTER_ADDR"):
        names, source = OPERATOR_VARS, "Training Operator (MASTER_ADDR, RANK, WORLD_SIZE)"
    else:
        return Place()
    missing = [name for name in names if not env.get(name)]
    if missing:
        fail(2, f"{source}: {', '.join(missing)} not set")
    host, port_text, rank_text, world_text = (env[name].strip() for name in names)
    try:
        port, rank, world_size = int(port_text), int(rank_text), int(world_text)
    except ValueError:
        values = ", ".join(f"{name}={env[name]!r}" for name in names[1:])
        fail(2, f"{source}: {values} must be integers")
    if not 0 < port < 65536:
        fail(2, f"{source}: {names[1]}={port} is not a port (1-65535)")
    if world_size < 1 or not 0 <= rank < world_size:
        fail(2, f"{source}: {names[2]}={rank} must be in [0, {names[3]}={world_size})")
    return Place(rank, world_size, host, port, source)


def load_data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str]:
    """Features, integer labels and where they came from: train.npz if there, else --dataset."""
    path = Path(args.data_dir) / "train.npz" if args.data_dir else None
    if path is None or not path.is_file():
        bunch = DATASETS[args.dataset]()
        where = f"{path} not found, " if path else ""
        return bunch.data.astype(np.float32), bunch.target, f"{where}scikit-learn {args.dataset}"
    try:
        with np.load(path) as arrays:
            x, y = arrays["x"].astype(np.float32), arrays["y"].reshape(-1)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        fail(3, f"{path} must hold arrays x [N, F] and y [N] ({exc})")
    if x.ndim != 2 or len(x) != len(y) or len(x) == 0 or x.shape[1] == 0:
        fail(3, f"{path}: x {x.shape} and y {y.shape} do not match")
    if y.dtype.kind not in "iub" and not (y.dtype.kind == "f" and np.all(y == np.round(y))):
        fail(3, f"{path}: y must hold integer class labels (it is {y.dtype})")
    if y.min() < 0:
        fail(3, f"{path}: y must hold class labels 0, 1, ... (it has {y.min()})")
    return x, y.astype(np.int64), str(path)


@dataclass
class Split:
    """The held-out 20% (the same on every rank) and this rank's shard of the other 80%."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_class: int


def split(x: np.ndarray, y: np.ndarray, place: Place, seed: int, source: str) -> Split:
    try:
        x_train, x_test, y_train, y_test = train_test_split(
            x, y, test_size=0.2, stratify=y, random_state=seed
        )
    except ValueError as exc:  # too few rows, or a class with a single row
        fail(3, f"{source}: no stratified 80/20 split ({exc})")
    if len(x_train) < place.world_size:
        fail(3, f"{source}: {len(x_train)} training rows for {place.world_size} ranks")
    shard = slice(place.rank, None, place.world_size)
    return Split(x_train[shard], y_train[shard], x_test, y_test, max(int(y.max()) + 1, 2))


def tracker_address(host: str, timeout_s: float) -> str:
    """``host``'s IPv4 address, once it resolves: a pod's DNS name appears only once the pod is up.

    Resolved once, here, with retries: XGBoost would look the name up again when each rank
    finalizes, where a DNS answer that comes late (a busy cluster DNS) fails a finished run. The
    tracker listens on IPv4 (0.0.0.0), so an IPv4 address is what every rank needs.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
        except socket.gaierror as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the tracker's host {host!r} did not resolve: {exc}") from exc
            time.sleep(2)


@contextlib.contextmanager
def joined(place: Place) -> Iterator[None]:
    """Inside: every rank in XGBoost's collective (rank 0 runs the tracker). Alone: nothing."""
    if place.world_size == 1:
        yield
        return
    assert place.tracker_host is not None and place.tracker_port is not None
    tracker = None
    if place.rank == 0:
        # Every interface: the workers reach it as 127.0.0.1 on a laptop, by DNS name in a pod.
        tracker = RabitTracker(
            n_workers=place.world_size, host_ip="0.0.0.0", port=place.tracker_port, sortby="task"
        )
        tracker.start()
        log(place, f"tracker listening on 0.0.0.0:{place.tracker_port}")
    join_args = {
        "dmlc_tracker_uri": tracker_address(place.tracker_host, TRACKER_WAIT_S),
        "dmlc_tracker_port": place.tracker_port,
        # The tracker sorts the task ids as strings: zero-padded, rank 10 comes after rank 9.
        "dmlc_task_id": f"{place.rank:06d}",
        "dmlc_retry": 12,  # connection attempts, 2 s longer apart each: the tracker may be late
    }
    with collective.CommunicatorContext(**join_args):
        if collective.get_rank() != place.rank:
            raise RuntimeError(f"XGBoost gave rank {collective.get_rank()} to {place}")
        yield
    if tracker is not None:
        tracker.wait_for()


def all_sum(value: float) -> float:
    """The sum of ``value`` over the ranks (the value itself alone)."""
    return float(collective.allreduce(np.array([value], dtype=np.float64), collective.Op.SUM)[0])


def checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``round-<N>.json`` files, newest first."""
    found = []
    for path in folder.glob("round-*.json"):
        with contextlib.suppress(ValueError):
            found.append((int(path.stem.removeprefix("round-")), path))
    return sorted(found, reverse=True)


def newest_checkpoint(folder: Path, place: Place) -> tuple[int, bytes] | None:
    """The newest checkpoint that loads, as (round, model JSON); a corrupt one is skipped."""
    for round_, path in checkpoints(folder):
        try:
            raw = path.read_bytes()
            rounds = xgb.Booster(model_file=bytearray(raw)).num_boosted_rounds()
        except (OSError, xgb.core.XGBoostError) as exc:
            reason = (str(exc).strip().splitlines() or ["?"])[0]  # not XGBoost's stack trace
            log(place, f"checkpoint {path} is unreadable, trying the one before it ({reason})")
            continue
        if rounds != round_:
            log(place, f"checkpoint {path} holds {rounds} rounds, trying the one before it")
            continue
        return round_, raw
    return None


class Checkpointer(xgb.callback.TrainingCallback):
    """Every ``every`` rounds and after the last: the held-out metrics and, on rank 0, the
    booster (``checkpoints/round-<N>.json``, the newest two kept) and ``metrics.jsonl``."""

    def __init__(self, place: Place, output: Path, every: int, total: int, rows: list[str]):
        super().__init__()
        self.place, self.output, self.every, self.total = place, output, every, total
        self.rows = rows  # metrics.jsonl's lines up to the round resumed from

    def after_iteration(self, model: xgb.Booster, epoch: int, evals_log: dict) -> bool:
        done = model.num_boosted_rounds()
        metrics = {name: values[-1] for name, values in evals_log.get("test", {}).items()}
        self.rows.append(json.dumps({"round": done} | {f"test_{k}": v for k, v in metrics.items()}))
        if done == self.total or (self.every and done % self.every == 0):
            shown = " ".join(f"test-{name} {value:.5f}" for name, value in metrics.items())
            saved = " (checkpoint saved)" if self.place.rank == 0 else ""
            if self.place.rank == 0:
                self.save(model, done)
            log(self.place, f"round {done}/{self.total} {shown}{saved}")
        return False

    def save(self, model: xgb.Booster, done: int) -> None:
        folder = self.output / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"round-{done}.json", model.save_raw("json").decode())
        for _, old in checkpoints(folder)[KEEP_CHECKPOINTS:]:
            old.unlink(missing_ok=True)
        write_atomic(self.output / "metrics.jsonl", "".join(f"{row}\n" for row in self.rows))


def earlier_metrics(output: Path, resumed_from: int | None) -> list[str]:
    """metrics.jsonl's lines up to the round resumed from (the rounds after it are redone)."""
    path = output / "metrics.jsonl"
    if resumed_from is None or not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            if int(json.loads(line)["round"]) <= resumed_from:
                rows.append(line)
    return rows


def threads_from_env(env: Mapping[str, str]) -> int | None:
    """``OMP_NUM_THREADS`` when set (XGBoost's nthread); else None: XGBoost decides."""
    threads = env.get("OMP_NUM_THREADS", "").strip()
    if threads and (not threads.isdigit() or int(threads) < 1):
        fail(2, f"OMP_NUM_THREADS={threads!r} must be a positive integer")
    return int(threads) if threads else None


def booster_params(args: argparse.Namespace, num_class: int, threads: int | None) -> dict:
    params = {
        "tree_method": "hist",
        "eta": args.lr,
        "max_depth": args.max_depth,
        "seed": args.seed,
    }
    if num_class == 2:
        params.update(objective="binary:logistic", eval_metric=["logloss", "error"])
    else:
        params.update(objective="multi:softprob", num_class=num_class)
        params.update(eval_metric=["mlogloss", "merror"])
    if threads is not None:
        params["nthread"] = threads
    return params


def accuracy(booster: xgb.Booster, dtest: xgb.DMatrix, y_test: np.ndarray) -> float:
    """The share of held-out rows whose most likely class is the label."""
    predicted = booster.predict(dtest)
    labels = predicted.argmax(axis=1) if predicted.ndim == 2 else (predicted > 0.5)
    return float(np.mean(labels.astype(np.int64) == y_test))


def resume_point(output: Path, place: Place) -> tuple[int, bytes] | None:
    """Rank 0's newest checkpoint, broadcast: every rank starts from the same round."""
    found = newest_checkpoint(output / "checkpoints", place) if place.rank == 0 else None
    if place.world_size == 1:
        return found
    return collective.broadcast({"found": found}, 0)["found"]  # broadcast refuses a bare None


def train(
    args: argparse.Namespace, place: Place, data: Split, threads: int | None
) -> tuple[xgb.Booster, dict]:
    """Build the matrices, resume or start, boost to --epochs rounds; the booster and summary."""
    output = Path(args.output_dir)
    dtrain = xgb.QuantileDMatrix(data.x_train, label=data.y_train)
    dtest = xgb.DMatrix(data.x_test, label=data.y_test)
    found = resume_point(output, place)
    booster, resumed_from = None, None
    if found is not None:
        resumed_from = found[0]
        booster = xgb.Booster(model_file=bytearray(found[1]))
        log(place, f"resuming from round {resumed_from}")
    remaining = max(args.epochs - (resumed_from or 0), 0)
    if remaining == 0:
        log(place, f"round {resumed_from} reached already (--epochs {args.epochs}): no training")
    rows = earlier_metrics(output, resumed_from) if place.rank == 0 else []
    checkpointer = Checkpointer(place, output, args.checkpoint_every_steps, args.epochs, rows)
    history: dict = {}
    booster = xgb.train(
        booster_params(args, data.num_class, threads),
        dtrain,
        num_boost_round=remaining,
        evals=[(dtest, "test")],
        evals_result=history,
        xgb_model=booster,
        callbacks=[checkpointer],
        verbose_eval=False,
    )
    summary = {
        "rounds": booster.num_boosted_rounds(),
        "rounds_trained": remaining,
        "resumed_from_round": resumed_from,
        "test_accuracy": accuracy(booster, dtest, data.y_test),
        "test_rows": len(data.y_test),
        "num_class": data.num_class,
    }
    for name, values in history.get("test", {}).items():
        if name.endswith("logloss"):
            summary[f"test_{name}"] = values[-1]
    return booster, summary


def save_outputs(output: Path, booster: xgb.Booster, summary: dict) -> None:
    """``model/model.json`` and ``summary.json``, each whole or not at all."""
    folder = output / "model"
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".partial-{os.getpid()}.json"
    booster.save_model(partial)
    with open(partial, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, folder / "model.json")
    write_atomic(output / "summary.json", json.dumps(summary, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    place = place_from_env(os.environ)
    threads = threads_from_env(os.environ)
    log(place, f"place from {place.source}")
    x, y, source = load_data(args)
    data = split(x, y, place, args.seed, source)
    log(place, f"data: {source} ({len(x)} rows, {x.shape[1]} features, {data.num_class} classes)")
    log(place, f"shard: {len(data.y_train)} training rows, {len(data.y_test)} held out")
    with joined(place):
        total = all_sum(place.rank + 1.0)
        log(place, f"world_size={place.world_size} collective_sum={total:g}")
        booster, summary = train(args, place, data, threads)
        train_rows = int(all_sum(float(len(data.y_train))))
    checksum = hashlib.sha256(booster.save_raw("json")).hexdigest()[:12]
    rounds, score = summary["rounds"], summary["test_accuracy"]
    log(place, f"done: rounds={rounds} test_accuracy={score:.4f} model_checksum={checksum}")
    if place.rank == 0:
        summary.update(
            world_size=place.world_size,
            train_rows=train_rows,
            collective_sum=total,
            model_checksum=checksum,
            wall_time_s=round(time.monotonic() - started, 3),
            xgboost=xgb.__version__,
        )
        save_outputs(Path(args.output_dir), booster, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
