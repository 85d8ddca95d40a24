"""``python -m trainer.ray_train --workers N [...] -- FLAGS``: ``python -m trainer.train FLAGS`` on
``N`` Ray Train workers, as the entrypoint of a KubeRay RayJob.

Ray Train's ``TorchTrainer`` places the workers (``--cpus-per-worker``, ``--gpus-per-worker``
each), sets the torchrun variables in each (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and joins them to one process group (gloo
on CPUs, nccl on GPUs) before it calls :func:`train_loop_per_worker`, which runs our trainer's
``main`` in that worker. The trainer reads its identity as under torchrun and reuses Ray's
process group (:func:`trainer.distributed.init_process_group`). Nothing is reported to Ray: the
trainer checkpoints to disk or S3 itself and resumes from there, so Ray's run folder
(``--storage-path``, default ``$TMPDIR/ray-results``) stays empty but for Ray's own markers.

Exit status: 0 when every worker's trainer returned 0. A worker whose trainer returns non-zero
raises :class:`WorkerExit` with that code, which fails the Ray run (``max_failures=0``: Ray does
not restart it; a restart is the job's business, after its restart policy) and this command exits
with the workers' code: the first permanent one (1-127, e.g. 2 for bad flags) when there is one,
else the retryable one (e.g. 200: a rank lost its peers; 143: stopped, see below), as
``trainer.torchrun`` does. A failure without a worker's code (a worker's actor or process died, a
node or pod was lost, the OOM killer struck, Ray itself failed) exits 200 (``EXIT_PEER_LOST``,
retryable): the job's retry resumes from the last checkpoint. So does a cluster this command
cannot reach.

Stopping: a pod's SIGTERM never reaches a trainer under Ray Train (it runs in a thread of a Ray
actor, and PID 1 is ``ray start``), so each worker watches a stop file instead
(:mod:`trainer.stop_file`): ``KFP_DDP_STOP_FILE`` when this command's environment sets it, else
``$TMPDIR/kfp-ddp-stop`` on the worker's machine, which a RayJob's worker pods create in their
``preStop`` hook. Once it exists, every worker checkpoints at the next stop check and exits 143.

The cluster: ``RAY_ADDRESS`` when set (a RayJob's submitter sets it), else the cluster already
running on this machine (``address="auto"``); ``--local`` starts a throwaway one-machine cluster
instead (under ``/tmp/ray``, stopped when this command ends). A ``host:port`` that takes no
connection within ``--connect-timeout-s`` exits 200 (``ray.init`` alone would retry for minutes).
Ray writes its session files under its temp dir (``/tmp/ray`` or ``ray start --temp-dir``; the
object store maps ``/dev/shm``) and this command its run folder under ``--storage-path``: nothing
outside ``/tmp``, ``$TMPDIR`` and ``$HOME``.

The workers' output reaches this command through Ray's log forwarding, each line prefixed with
the worker (``(RayTrainWorker pid=...)``); Train V2's copy of every ``print`` through its logger is
switched off (``RAY_TRAIN_ENABLE_PRINT_PATCH=0`` unless set) so each line comes once. This
command's own lines start with ``[ray_train]``: the run it starts, then ``done`` or ``failed``
with the rank, its code and the trainer's error line.

Relative paths in the trainer's flags mean the same as in this command: each worker first changes
to this command's working directory when that directory exists on its machine (Ray Train would
otherwise leave it in a per-run folder of Ray's session directory).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import secrets
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from kfp_ddp.console import whole_lines
from trainer import stop_file
from trainer.errors import EXIT_CONFIG, EXIT_PEER_LOST
from trainer.flags import parse_flags
from trainer.torchrun import worker_exit_code

PREFIX = "[ray_train]"
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""How a Ray cluster's token authentication is set up (KubeRay sets them where it is on)."""
USAGE = (
    "python -m trainer.ray_train --workers N [--gpus-per-worker 0|1] [--cpus-per-worker C] "
    "[--name NAME] [--storage-path DIR] [--connect-timeout-s S] [--local] -- TRAINER_FLAGS..."
)


class WorkerExit(RuntimeError):
    """A worker's ``trainer.train`` returned ``code`` (non-zero): fails the Ray run and carries the
    code, the rank and the trainer's last error line back to this command.

    Ray hands a worker's exception to the driver pickled; :meth:`__reduce__` keeps the fields
    (the default pickling of an exception keeps ``args`` alone).
    """

    def __init__(self, code: int, rank: int, error: str | None = None):
        self.code, self.rank, self.error = code, rank, error
        super().__init__(self.summary)

    @property
    def summary(self) -> str:
        """One line: the rank, its code and its error (Train V1 hands the driver this exception
        as a ``RayTaskError`` subclass whose ``str`` is the whole remote traceback)."""
        said = f": {self.error}" if self.error else ""
        return f"trainer.train on rank {self.rank} exited {self.code}{said}"

    def __reduce__(self):
        return (self.__class__, (self.code, self.rank, self.error))


class _ErrorLineTee(io.TextIOBase):
    """Writes through to ``stream`` and remembers the last line that reports an error (the
    trainer's ``[trainer] error: ...``, argparse's ``...: error: ...``), so a failing worker can
    name its cause in :class:`WorkerExit`: Ray forwards a worker's output to the driver
    asynchronously, and the driver may be gone before the last lines arrive."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.last_error: str | None = None
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()[-4096:]
        for line in lines:
            if "error:" in line:
                self.last_error = line.strip()
        return self.stream.write(text)

    def end(self) -> str | None:
        """The last error line, counting an unfinished last line too."""
        if "error:" in self._partial:
            self.last_error, self._partial = self._partial.strip(), ""
        return self.last_error

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.stream, "encoding", "utf-8"))


def _exit_status(code: object) -> int:
    """The process status ``sys.exit(code)`` gives (None → 0, an int as is, else 1)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def run_trainer(argv: list[str]) -> tuple[int, str | None]:
    """``trainer.train.main(argv)`` in this process: its exit status (argparse's ``SystemExit``
    included) and the last error line it wrote to stderr."""
    # Imported here, in the worker: trainer.train loads torch and the models, which the driver
    # (this command, on the Ray head) never needs.
    from trainer.train import main

    tee = _ErrorLineTee(sys.stderr)
    sys.stderr = tee
    try:
        try:
            code = main(argv)
        except SystemExit as exit_:  # malformed flags: argparse printed why and exits 2
            code = _exit_status(exit_.code)
    finally:
        sys.stderr = tee.stream
    return code, tee.end()


def train_loop_per_worker(config: dict) -> None:
    """What each Ray Train worker runs: the trainer with ``config["argv"]``, from the driver's
    working directory (``config["cwd"]``) when this machine has it, watching the stop file
    ``config["stop_file"]`` (None: this machine's default) and marked running beside it.

    Ray has set the torchrun variables and joined the process group by now. Raises
    :class:`WorkerExit` when the trainer returns non-zero, so Ray fails the run.
    """
    cwd = config.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    path = config.get("stop_file") or stop_file.default_path()
    os.environ[stop_file.STOP_FILE_ENV] = path
    with stop_file.running_marker(path):
        code, error = run_trainer(list(config["argv"]))
    if code != 0:
        raise WorkerExit(code, int(os.environ.get("RANK", "0")), error)


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and every exception it wraps: ``__cause__``/``__context__``, Train V2's
    ``WorkerGroupError.worker_failures`` (rank → the worker's error, wrapped with its traceback in
    ``_base_exc``), Ray's ``RayTaskError.cause`` (Train V1)."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        failures = getattr(current, "worker_failures", None)
        if isinstance(failures, dict):
            todo += [failures[rank] for rank in sorted(failures)]
        for name in ("_base_exc", "cause", "__cause__", "__context__"):
            inner = getattr(current, name, None)
            if isinstance(inner, BaseException):
                todo.append(inner)


def worker_exits(err: BaseException) -> list[WorkerExit]:
    """The :class:`WorkerExit` of each failed worker found in Ray's ``err``, by rank."""
    found: dict[int, WorkerExit] = {}
    for inner in _causes(err):
        if isinstance(inner, WorkerExit):
            found.setdefault(inner.rank, inner)
    return [found[rank] for rank in sorted(found)]


def exit_code_of(err: BaseException) -> tuple[int, WorkerExit | None]:
    """This command's status for a failed run, and the worker failure it comes from: the first
    permanent worker code, else a retryable one (``trainer.torchrun``'s rule); without one (an
    actor died, a node was lost, Ray failed) ``EXIT_PEER_LOST``: retryable, as a lost rank is."""
    exits = worker_exits(err)
    if not exits:
        return EXIT_PEER_LOST, None
    code = worker_exit_code([e.code for e in exits])
    return code, next(e for e in exits if e.code == code)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.ray_train",
        usage=USAGE,
        description="Run python -m trainer.train on Ray Train workers (a KubeRay RayJob's "
        "entrypoint). The trainer's flags follow '--'.",
    )
    parser.add_argument("--workers", type=int, required=True, help="Ray Train workers (ranks)")
    parser.add_argument(
        "--gpus-per-worker",
        type=int,
        default=0,
        choices=(0, 1),
        help="GPUs per worker: 0 (gloo on CPUs) or 1 (nccl); the trainer drives one device per "
        "process, so more would sit idle",
    )
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs per worker")
    parser.add_argument("--name", default=None, help="the Ray Train run's name (Ray's default)")
    parser.add_argument(
        "--storage-path",
        default=os.path.join(tempfile.gettempdir(), "ray-results"),
        help="Ray Train's run folder, on every node (nothing is checkpointed there); "
        "default $TMPDIR/ray-results",
    )
    parser.add_argument(
        "--connect-timeout-s",
        type=float,
        default=60.0,
        help="how long to wait for the head at RAY_ADDRESS to take connections (default 60)",
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="start a throwaway Ray cluster on this machine instead of joining RAY_ADDRESS or "
        "the running one",
    )
    return parser


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """This command's flags and the trainer's (everything after the first ``--``)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def _say(message: str) -> None:
    print(f"{PREFIX} {message}", flush=True)


def _parse_trainer_flags(flags: list[str]) -> int | None:
    """None when the trainer's flags parse, else the exit status of its parser (2: it printed
    why, 0: it printed ``--help``): a typo fails here, before any Ray worker starts."""
    try:
        parse_flags(flags)
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    return None


def unreachable(address: str, wait_s: float) -> str | None:
    """Why the head at ``address`` (``host:port`` of its GCS) takes no connection within
    ``wait_s``, or None (also for addresses Ray resolves itself: ``auto``, ``ray://``, ...).

    ``ray.init`` retries an address nobody answers at for some 13 minutes (20 tries of ~40 s),
    e.g. a mistyped ``RAY_ADDRESS``; a head that is still starting answers within seconds.
    """
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return None
        except OSError as err:
            if time.monotonic() >= deadline:
                return f"nothing answers at {address} ({err})"
            time.sleep(1)


def _connect(args: argparse.Namespace) -> str:
    import ray

    if args.local:
        if not any(os.environ.get(name) for name in AUTH_VARIABLES):
            # Ray 2.60 turns token authentication on for a cluster that ray.init() starts and
            # saves a new token in ~/.ray/auth_token, where every later `ray start` on this
            # machine finds it and turns authentication on there too. A token in the
            # environment (which the cluster's processes inherit) serves this run alone.
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        cpus = max(os.cpu_count() or 1, math.ceil(args.workers * args.cpus_per_worker))
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
        return "a local Ray cluster (--local)"
    address = os.environ.get("RAY_ADDRESS") or "auto"
    why = unreachable(address, args.connect_timeout_s)
    if why:
        raise ConnectionError(why)
    ray.init(address=address)
    return f"the Ray cluster at {address}"


def _trainer(args: argparse.Namespace, flags: list[str]):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    gpus = args.gpus_per_worker
    resources: dict[str, float] = {"CPU": args.cpus_per_worker}
    if gpus > 0:
        resources["GPU"] = gpus
    # Train V1 runs the run's coordinator as an actor that holds a CPU of its own by default, so
    # N workers of 1 CPU would wait forever on an N-CPU cluster; V2's controller holds none (and
    # V2 refuses the setting).
    coordinator: dict[str, Any] = {}
    if train_version() == "V1":
        coordinator["trainer_resources"] = {"CPU": 0}
    return TorchTrainer(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={
            "argv": flags,
            "cwd": os.getcwd(),
            "stop_file": os.environ.get(stop_file.STOP_FILE_ENV) or None,
        },
        scaling_config=ScalingConfig(
            num_workers=args.workers,
            use_gpu=gpus > 0,
            resources_per_worker=resources,
            **coordinator,
        ),
        torch_config=TorchConfig(backend="nccl" if gpus > 0 else "gloo"),
        run_config=RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            failure_config=FailureConfig(max_failures=0),
        ),
    )


def train_version() -> str:
    """Which Ray Train runs ``fit``: V2 (Ray 2.60's default) unless ``RAY_TRAIN_V2_ENABLED=0``."""
    from ray.train.v2._internal.constants import is_v2_enabled

    return "V2" if is_v2_enabled() else "V1"


def main(argv: list[str] | None = None) -> int:
    ours, flags = split_argv(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(ours)  # exits 2 on malformed flags
    if args.workers < 1 or args.cpus_per_worker <= 0:
        print(f"{USAGE}\n--workers must be >= 1 and --cpus-per-worker > 0", file=sys.stderr)
        return EXIT_CONFIG
    status = _parse_trainer_flags(flags)
    if status is not None:
        if status:
            _say(f"the trainer's flags do not parse (see above); exiting {status}")
        return status
    try:
        where = _connect(args)
    except (ConnectionError, RuntimeError) as err:
        _say(
            f"cannot reach a Ray cluster ({type(err).__name__}: {_first_line(err)}); exiting "
            f"{EXIT_PEER_LOST} to be retried"
        )
        return EXIT_PEER_LOST
    backend = "nccl" if args.gpus_per_worker else "gloo"
    _say(
        f"{args.workers} workers x ({args.cpus_per_worker:g} CPU, {args.gpus_per_worker} GPU), "
        f"{backend}, Ray Train {train_version()} on {where}: "
        + shlex.join(["python", "-m", "trainer.train", *flags])
    )
    # Each worker's output reaches this command once, as the trainer wrote it: Train V2 would
    # also send every print through its logger (a second copy on stderr).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    try:
        _trainer(args, flags).fit()
    except Exception as err:  # TrainingFailedError & co.: the run failed
        code, cause = exit_code_of(err)
        retried = "" if cause else " to be retried"  # no worker's code: a lost actor, node, Ray
        _say(f"failed: {cause.summary if cause else describe(err)}; exiting {code}{retried}")
        return code
    _say(f"done: the trainer exited 0 on all {args.workers} workers")
    return 0


def describe(err: BaseException) -> str:
    """One line for a failed run without a worker's exit code: the first failed worker's own
    error when Train V2 names it (its ``WorkerGroupError`` says little in its first line)."""
    failures = getattr(err, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        inner = getattr(failures[rank], "_base_exc", None) or failures[rank]
        return f"rank {rank}: {type(inner).__name__}: {_first_line(inner)}"
    return f"{type(err).__name__}: {_first_line(err)}"


def _first_line(err: object) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


if __name__ == "__main__":
    whole_lines()  # a line of this process is never torn by another's in the one log
    sys.exit(main())
