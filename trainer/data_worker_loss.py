"""A DataLoader worker that died, said in one line, with an exit code the operator can act on.

When one of its worker processes dies, torch's DataLoader raises a RuntimeError in the training
process: "DataLoader worker (pid 123) is killed by signal: Killed." (from its SIGCHLD handler,
wherever the process was) or "DataLoader worker (pid(s) 123) exited unexpectedly" (while it
waited for a batch). Either used to end the trainer with a traceback and exit 1, which the
ExitCode restart policy reads as permanent: a worker killed because the node ran short of memory
failed the whole job for good, and a worker out of ``/dev/shm`` was not named as such.

- killed by SIGBUS: ``/dev/shm`` is full (the batches in flight travel through it) → permanent
  (:class:`~trainer.errors.OutOfMemory`, exit 5): the same batches need the same room;
- killed by SIGKILL while this container's memory reached its limit (cgroup v2
  ``memory.events``' ``oom`` rose since the trainer started) → permanent, exit 5: a restart
  needs the same memory;
- any other death (the node's out-of-memory killer, a person, a crash) →
  :class:`DataWorkerLost`, retryable: ``128 + signal`` (137 for SIGKILL), so the job restarts
  and resumes from its last checkpoint.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainer.errors import OutOfMemory
from trainer.shared_memory import shm_bytes

KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.")
EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
EXIT_WORKER_LOST = 128 + signal.SIGKILL
"""A worker that died of an unknown cause: retryable, as if the process had been killed."""
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where this process's cgroup is named, and where cgroup v2 is mounted."""


class DataWorkerLost(RuntimeError):
    """A data-loading worker died of something a restart may not meet again (retryable)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class DataWorkerDied(RuntimeError):
    """The DataLoader's error, with the worker's pid and the signal that ended it (if known)."""

    def __init__(self, pid: int, signum: int | None, cause: str):
        super().__init__(cause)
        self.pid, self.signum = pid, signum


def watched(loader: Iterable) -> Iterator[Any]:
    """``loader``'s batches; a worker's death raises :class:`DataWorkerDied` with its signal,
    which torch's "exited unexpectedly" does not say (its worker processes do)."""
    iterator = iter(loader)
    try:
        yield from iterator
    except RuntimeError as err:
        found = EXITED.search(str(err))
        if found is None:
            raise
        pid = int(found.group(1).split(",")[0])
        codes = {w.pid: w.exitcode for w in getattr(iterator, "_workers", ())}
        code = codes.get(pid)
        signum = -code if code is not None and code < 0 else None
        raise DataWorkerDied(pid, signum, str(err)) from err


def worker_death(err: BaseException) -> DataWorkerDied | None:
    """``err`` as a worker's death, or None when it is something else."""
    if isinstance(err, DataWorkerDied):
        return err
    found = KILLED.search(str(err))
    if found is None:
        return None
    names = {signal.strsignal(s): s for s in signal.Signals}
    return DataWorkerDied(int(found.group(1)), names.get(found.group(2)), str(err))


def memory_limit_hits() -> int | None:
    """How often this process's cgroup reached its memory limit (cgroup v2 ``memory.events``'
    ``oom``); None where that is not known (cgroup v1, no memory controller)."""
    events = _cgroup_file("memory.events")
    if events is None:
        return None
    try:
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def verdict(
    died: DataWorkerDied, config: Any, limit_hits_before: int | None
) -> OutOfMemory | DataWorkerLost:
    """What the trainer does about ``died``: an :class:`OutOfMemory` (permanent) or a
    :class:`DataWorkerLost` (retryable), each with its one line."""
    workers = "auto" if config.num_workers is None else config.num_workers
    load = (
        f"--num-workers {workers} workers per process, each preparing batches of --batch-size "
        f"{config.batch_size} at --image-size {config.image_size}"
    )
    who = f"a data-loading worker (pid {died.pid})"
    if died.signum == signal.SIGBUS:
        return OutOfMemory(
            f"{who} was killed by SIGBUS: /dev/shm ({_shm_size()}) is full, and the batches in "
            f"flight travel through it ({load}); give the pod a bigger /dev/shm (shm_size in "
            'overrides_json, e.g. {"shm_size": "8Gi"}) or lower --num-workers or --batch-size'
        )
    hits = memory_limit_hits()
    at_limit = hits is not None and limit_hits_before is not None and hits > limit_hits_before
    if died.signum == signal.SIGKILL and at_limit:
        return OutOfMemory(
            f"{who} was killed by the out-of-memory killer at this container's memory limit "
            f"({_memory_limit()}) ({load}); give each node more memory (memory_limit, "
            "memory_request) or lower --num-workers, --batch-size or --image-size"
        )
    how = f"killed by {signal.Signals(died.signum).name}" if died.signum else "lost"
    code = 128 + died.signum if died.signum else EXIT_WORKER_LOST
    return DataWorkerLost(
        f"{who} was {how}, not by this container's memory limit (the node's out-of-memory "
        f"killer, a person, a crash); exiting {code} so the job is restarted and resumes from "
        "its last checkpoint",
        code,
    )


def _cgroup_file(name: str) -> Path | None:
    """This process's cgroup v2 file ``name``, or None."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = CGROUP_ROOT / line[3:].strip("/") / name
            return path if path.is_file() else None
    return None


def _memory_limit() -> str:
    """``memory.max`` of this cgroup in GiB, or 'unknown'."""
    limit = _cgroup_file("memory.max")
    try:
        text = limit.read_text().strip() if limit else "unknown"
    except OSError:
        return "unknown"
    return f"{int(text) / 2**30:.1f} GiB" if text.isdigit() else text


def _shm_size() -> str:
    size = shm_bytes()
    return "size unknown" if size is None else f"{size / 2**20:.0f} MiB"
