"""Distributed identity from the environment, process-group set-up/tear-down, and SIGTERM.

Three launch styles give the same :class:`DistEnv`:

* ``torchrun`` (also what the Training Operator runs when ``nprocPerNode`` > 1): ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``. Ray
  Train's TorchTrainer (``trainer.ray_train``) sets the same in each worker, and has joined the
  process group already.
* The Training Operator running the trainer directly in each pod: ``RANK`` (the pod index),
  ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` plus ``PET_*`` copies; no ``LOCAL_RANK``.
* Only ``PET_NNODES``/``PET_NODE_RANK``/``PET_MASTER_ADDR``/``PET_MASTER_PORT`` (one process per
  node).

With none of them set the trainer runs as one process without a process group.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from trainer.cpu_request import requested_cpus
from trainer.errors import ConfigError
from trainer.stop_file import STOP_FILE_ENV

T = TypeVar("T")


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def dist_env_from(environ: Mapping[str, str] = os.environ) -> DistEnv:
    """Read the distributed identity from torchrun's, the Training Operator's or OpenMPI's
    (``mpirun``) variables."""
    rank, world = _int_env(environ, "RANK"), _int_env(environ, "WORLD_SIZE")
    local_rank = _int_env(environ, "LOCAL_RANK")
    nproc_text = environ.get("PET_NPROC_PER_NODE", "")
    nproc = int(nproc_text) if nproc_text.isdigit() else None
    if rank is not None and world is not None:
        if local_rank is None and nproc is not None and nproc > 1:
            raise ConfigError(
                f"WORLD_SIZE={world} counts PET_NPROC_PER_NODE={nproc} processes per pod, but this "
                "process was not started by torchrun (no LOCAL_RANK); start the trainer with "
                "torchrun or set nprocPerNode to 1"
            )
        launcher = "torchrun" if local_rank is not None else "operator"
        local_world = (
            _int_env(environ, "LOCAL_WORLD_SIZE")
            or (nproc if local_rank is not None else None)
            or 1
        )
    elif environ.get("OMPI_COMM_WORLD_SIZE"):
        return _mpi_env(environ)
    elif environ.get("PET_NNODES") and environ.get("PET_NODE_RANK"):
        if (nproc or 1) > 1:
            raise ConfigError(
                f"PET_NPROC_PER_NODE={nproc_text} needs torchrun to start one process per device"
            )
        world, rank = _int_env(environ, "PET_NNODES"), _int_env(environ, "PET_NODE_RANK")
        launcher, local_world = "pet", 1
    else:
        return DistEnv()
    assert rank is not None and world is not None
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"RANK={rank} / WORLD_SIZE={world}: need 0 <= RANK < WORLD_SIZE")
    addr = environ.get("MASTER_ADDR") or environ.get("PET_MASTER_ADDR")
    port = _int_env(environ, "MASTER_PORT") or _int_env(environ, "PET_MASTER_PORT")
    if world > 1 and (not addr or not port):
        raise ConfigError(
            f"WORLD_SIZE={world} but MASTER_ADDR/MASTER_PORT are not set; set both (torchrun and "
            "the Training Operator do) or unset WORLD_SIZE to train in one process"
        )
    return DistEnv(
        rank=rank,
        local_rank=local_rank or 0,
        world_size=world,
        local_world_size=max(1, local_world),
        master_addr=addr,
        master_port=port,
        launcher=launcher,
    )


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (containers).

    In a pod with a CPU limit, the affinity mask still lists every core of the node; the quota in
    ``cpu.max`` (cgroup v2) or ``cpu.cfs_quota_us`` (v1) is what the pod really gets.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    quota = None
    try:
        text = (cgroup_root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            quota = int(text[0]) / int(text[1])
    except (OSError, ValueError, IndexError):
        try:
            us = int((cgroup_root / "cpu" / "cpu.cfs_quota_us").read_text())
            period = int((cgroup_root / "cpu" / "cpu.cfs_period_us").read_text())
            quota = us / period if us > 0 else None
        except (OSError, ValueError):
            quota = None
    if quota:
        cores = min(cores, max(1, int(quota)))
    return cores


def processes_on_this_machine(env: DistEnv) -> int:
    """Training processes sharing this machine's cores (all of them when MASTER is loopback)."""
    if env.master_addr in ("127.0.0.1", "localhost", "::1"):
        return max(env.world_size, env.local_world_size)
    return env.local_world_size


def configure_cpu_threads(env: DistEnv) -> int:
    """Share the cores between the processes of this machine unless OMP_NUM_THREADS says so:
    the CPUs this process may use (:func:`available_cpus`), at most what the pod requested.

    Oversubscribing cores is far worse than leaving one idle: OpenMP threads spin at barriers,
    so two 2-thread processes on 2 cores train many times slower than two 1-thread ones. A pod
    without a CPU limit sees every core of its node, which other pods use too: its request is
    its share (measured: two such trainers on a 2-core machine, 9 images/s against 175).
    """
    if not os.environ.get("OMP_NUM_THREADS"):
        cpus = min(available_cpus(), requested_cpus() or sys.maxsize)
        torch.set_num_threads(max(1, cpus // processes_on_this_machine(env)))
    return torch.get_num_threads()


_OWN_WORLD = False
"""Whether this module started the default process group, and so is the one to destroy it."""
_OWN_CONTROL_GROUP: Any = None
"""The gloo control group this module made inside a default group it did not start."""


def init_process_group(env: DistEnv, device: torch.device, timeout_s: float):
    """Join the job's process group; returns the group used for small control messages.

    ``timeout_s`` is the start-up timeout: how long a rank waits for the others to join (and,
    until :func:`set_collective_timeout`, for any collective). Control messages (the stop flag,
    checkpoint bytes) go over gloo on the CPU even when training uses nccl, so checking for
    SIGTERM does not synchronise the GPU stream.

    A default group that already exists is reused, not joined again (torch allows one): Ray
    Train's TorchTrainer (``trainer.ray_train``) starts it in every worker, with its own timeout,
    before the trainer runs. It must be the job's own (this rank, this world size); its
    collectives then wait ``timeout_s`` too, and it stays its starter's to destroy
    (:func:`destroy_process_group` leaves it alone).
    """
    global _OWN_WORLD, _OWN_CONTROL_GROUP
    if not env.distributed:
        return None
    timeout = datetime.timedelta(seconds=timeout_s)
    if dist.is_initialized():
        backend = _reuse_default_group(env, timeout_s)
    else:
        os.environ["MASTER_ADDR"] = str(env.master_addr)
        os.environ["MASTER_PORT"] = str(env.master_port)
        backend = "nccl" if device.type == "cuda" else "gloo"
        options: dict = {}
        if device.type == "cuda":
            options["device_id"] = device
        dist.init_process_group(
            backend,
            init_method="env://",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            **options,
        )
        _OWN_WORLD = True
    if backend == "gloo":
        return dist.group.WORLD
    group = dist.new_group(backend="gloo", timeout=timeout)
    if not _OWN_WORLD:
        _OWN_CONTROL_GROUP = group
    return group


def _reuse_default_group(env: DistEnv, timeout_s: float) -> str:
    """Check that the existing default group is this job's; returns its backend."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) != (env.rank, env.world_size):
        raise ConfigError(
            f"a process group (rank {rank} of {world}) already exists in this process, but "
            f"RANK={env.rank} / WORLD_SIZE={env.world_size}: whoever started it (e.g. Ray Train) "
            "must also set the environment of the same job"
        )
    set_collective_timeout(timeout_s, None)
    return str(dist.get_backend())


def set_collective_timeout(timeout_s: float, control_group) -> bool:
    """From now on a collective that waits longer than ``timeout_s`` fails (both groups).

    Called once training runs (after its first step, as torchtitan does: the first step may
    compile), so a hung peer ends the job after minutes instead of the start-up timeout. Uses
    ``torch.distributed.distributed_c10d._set_pg_timeout`` (private; False where it is missing).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return True
    from torch.distributed import distributed_c10d

    set_timeout = getattr(distributed_c10d, "_set_pg_timeout", None)
    if set_timeout is None:
        return False
    timeout = datetime.timedelta(seconds=timeout_s)
    set_timeout(timeout)
    if control_group is not None and control_group is not dist.group.WORLD:
        set_timeout(timeout, control_group)
    return True


def destroy_process_group() -> None:
    """Leave the process group if :func:`init_process_group` started it (safe on every exit
    path); in a default group it found (Ray Train's), destroy only the control group it made.

    Ray Train destroys its own group when the worker group shuts down; destroying it here first
    would leave Ray's shutdown a group that is gone.
    """
    global _OWN_WORLD, _OWN_CONTROL_GROUP
    own_world, control = _OWN_WORLD, _OWN_CONTROL_GROUP
    _OWN_WORLD, _OWN_CONTROL_GROUP = False, None
    if not (dist.is_available() and dist.is_initialized()):
        return
    if own_world:
        dist.destroy_process_group()
    elif control is not None:
        with contextlib.suppress(ValueError):  # already gone with the default group
            dist.destroy_process_group(control)


def agree(flags: Sequence[bool], group) -> list[bool]:
    """Each flag true on every rank if it is true on any rank (one MAX all-reduce over ``group``).

    A collective: every rank must call it at the same point, with as many flags.
    """
    if group is None:
        return [bool(flag) for flag in flags]
    value = torch.tensor([1 if flag else 0 for flag in flags], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return [bool(v) for v in value.tolist()]


MPI_PORT = 29500
"""The port rank 0 opens for the others under mpirun without MASTER_PORT (torch's default)."""
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"
"""Where OpenMPI reads its hostfile from (Kubeflow Trainer's MPI runtimes set it)."""


def _mpi_env(environ: Mapping[str, str]) -> DistEnv:
    """Who this process is under OpenMPI's ``mpirun``: ``OMPI_COMM_WORLD_*`` give the ranks; rank
    0's address (where the others meet) is MASTER_ADDR (``trainer.mpirun`` works it out: mpirun's
    own machine when the hostfile lists it, else the first host), else the hostfile's first host,
    else this machine when every rank runs here."""
    rank = _int_env(environ, "OMPI_COMM_WORLD_RANK")
    world = _int_env(environ, "OMPI_COMM_WORLD_SIZE")
    local_rank = _int_env(environ, "OMPI_COMM_WORLD_LOCAL_RANK") or 0
    local_world = _int_env(environ, "OMPI_COMM_WORLD_LOCAL_SIZE") or 1
    if rank is None or world is None or world < 1 or not 0 <= rank < world:
        raise ConfigError(
            f"OMPI_COMM_WORLD_RANK={rank} / OMPI_COMM_WORLD_SIZE={world}: not the environment "
            "mpirun gives its processes; start the trainer with mpirun"
        )
    addr = environ.get("MASTER_ADDR") or _first_host(environ.get(HOSTFILE_ENV))
    if addr is None and local_world == world:
        addr = "127.0.0.1"
    if addr is None and world > 1:
        raise ConfigError(
            f"mpirun started {world} ranks on several machines, but rank 0's address is unknown: "
            f"set MASTER_ADDR (mpirun -x MASTER_ADDR=<first host>) or run with a hostfile "
            f"({HOSTFILE_ENV})"
        )
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        master_addr=addr,
        master_port=_int_env(environ, "MASTER_PORT") or MPI_PORT,
        launcher="mpirun",
    )


def _first_host(hostfile: str | None) -> str | None:
    """The first host of an OpenMPI hostfile (None without one)."""
    return read_hostfile(hostfile)[0][0] if hostfile else None


def read_hostfile(path: str | None) -> list[tuple[str, int]]:
    """``(host, slots)`` per line of an OpenMPI hostfile (``host slots=N``, ``#`` comments;
    ``slots`` 1 when the line does not say)."""
    if not path:
        raise ConfigError(
            f"{HOSTFILE_ENV} is not set: run this where the MPI runtime's hostfile is (the "
            "launcher of a Kubeflow Trainer MPI runtime), or set it to a hostfile"
        )
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise ConfigError(f"{HOSTFILE_ENV}={path}: cannot read it ({err})") from None
    hosts = []
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = 1
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "slots" and value.isdigit():
                slots = int(value)
        hosts.append((words[0], slots))
    if not hosts:
        raise ConfigError(f"{HOSTFILE_ENV}={path} names no host")
    return hosts


def from_rank_0(read: Callable[[], T], env: DistEnv, group) -> T:
    """``read()`` run by rank 0 alone, its result on every rank (one broadcast over ``group``).

    A ``ConfigError`` it raises stops every rank: rank 0 raises it, the others a ConfigError with
    its message. A collective: every rank must call it at the same point.
    """
    payload: list[Any] = [None, None]
    failure: ConfigError | None = None
    if env.rank == 0:
        try:
            payload[0] = read()
        except ConfigError as err:
            failure, payload[1] = err, str(err)
    if group is not None:
        dist.broadcast_object_list(payload, src=0, group=group)
    if failure is not None:
        raise failure
    if payload[1] is not None:
        raise ConfigError(f"{payload[1]} (read by rank 0 for every rank)")
    return payload[0]


def any_rank(flag: bool, group) -> bool:
    """True on every rank if ``flag`` is true on any rank (a MAX all-reduce over ``group``)."""
    return agree([flag], group)[0]


class StopRequest:
    """Records SIGTERM (eviction, preemption) so the loop can stop at a step boundary; also a
    stop file (:mod:`trainer.stop_file`), where ``KFP_DDP_STOP_FILE`` names one, for a trainer
    that no SIGTERM reaches (under Ray Train)."""

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        self.signum: int | None = None
        self._previous: Any = None  # the SIGTERM handler this one replaced
        self.stop_file = environ.get(STOP_FILE_ENV) or None

    def install(self) -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        _write_stderr("[trainer] SIGTERM received: finishing the current step, then checkpointing")

    @property
    def requested(self) -> bool:
        """A SIGTERM came, or the stop file exists (looked for on each read until found: the
        loop reads this once per stop check)."""
        if self.signum is None and self.stop_file and os.path.exists(self.stop_file):
            self.signum = signal.SIGTERM  # the pod's SIGTERM, passed on by its preStop hook
            _write_stderr(
                f"[trainer] stop file {self.stop_file} found: finishing the current step, then "
                "checkpointing"
            )
        return self.signum is not None


def _write_stderr(line: str) -> None:
    """One line in one write, safe in a signal handler (no buffered stream is touched)."""
    with contextlib.suppress(OSError, ValueError):
        os.write(sys.stderr.fileno(), f"{line}\n".encode())
