"""The stop file: a pod's request to stop, for trainers that its SIGTERM cannot reach.

Under Ray Train (``trainer.ray_train``) the trainer runs in a thread of a Ray actor, and a KubeRay
pod's PID 1 is KubeRay's ``bash -c "... ray start ... --block"``: the SIGTERM of a pod deletion
(timeout, cancellation, preemption) never reaches it. So each worker pod's ``preStop`` hook runs
``python -m trainer.stop_file --wait-s N`` (``components.launcher.rayjob``), which creates the file
named by ``KFP_DDP_STOP_FILE`` (``trainer.ray_train`` sets it in each worker: default
``$TMPDIR/kfp-ddp-stop``, on the pod's ``/tmp`` emptyDir, one file for all the pod's workers).
Each trainer looks for it where it checks for SIGTERM (:class:`trainer.distributed.StopRequest`),
checkpoints at the next stop check and exits 143, as after a SIGTERM. The hook then waits until
every trainer of the pod has returned (each marks itself running beside the file:
:func:`running_marker`), at most ``N`` seconds, so the kubelet does not stop Ray before the
checkpoint is written.

A stop file stays until someone removes it: a trainer that starts while it exists stops at its
first stop check.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

STOP_FILE_ENV = "KFP_DDP_STOP_FILE"
"""The stop file's path; a trainer watches for one only when this is set."""
DEFAULT_NAME = "kfp-ddp-stop"
"""The stop file's name in ``$TMPDIR`` (a pod's ``/tmp`` emptyDir) when the variable is not set."""
RUNNING_SUFFIX = ".running-"
"""``<stop file>.running-<pid>``: a trainer of process ``pid`` runs (see :func:`running_marker`)."""
POLL_S = 0.5
"""How often the hook looks at the markers."""


def default_path() -> str:
    """Where the stop file is when ``KFP_DDP_STOP_FILE`` is not set: ``$TMPDIR/kfp-ddp-stop``."""
    return os.path.join(tempfile.gettempdir(), DEFAULT_NAME)


def path_from(environ: Mapping[str, str]) -> str:
    """The stop file that ``environ`` names, else :func:`default_path`."""
    return environ.get(STOP_FILE_ENV) or default_path()


@contextlib.contextmanager
def running_marker(path: str) -> Iterator[None]:
    """Marks this process's trainer as running until the block ends, for the hook to wait on.

    A marker that cannot be written (the stop file's folder is missing or read-only) gets a
    warning: the trainer still runs, and the hook just does not wait for it.
    """
    marker = Path(f"{path}{RUNNING_SUFFIX}{os.getpid()}")
    try:
        marker.touch()
    except OSError as err:
        print(f"[stop_file] WARNING: cannot mark this trainer running ({err})", file=sys.stderr)
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def running_trainers(path: str) -> list[int]:
    """The processes whose trainer runs by their markers beside ``path``; a marker of a process
    that is gone (killed before it could remove it) does not count."""
    pids = []
    for marker in glob.glob(glob.escape(path) + RUNNING_SUFFIX + "*"):
        pid = marker.rpartition(RUNNING_SUFFIX)[2]
        if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
            pids.append(int(pid))
    return sorted(pids)


def request_stop(path: str) -> None:
    """Create the stop file. Its content is never read (only that it exists), so a plain create
    is enough: a reader sees it or not, never half of it."""
    Path(path).touch()


def wait_for_trainers(path: str, wait_s: float) -> list[int]:
    """Wait until no trainer runs beside ``path``, at most ``wait_s``; those still running."""
    deadline = time.monotonic() + wait_s
    running = running_trainers(path)
    while running and time.monotonic() < deadline:
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        running = running_trainers(path)
    return running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.stop_file",
        description="Ask the trainers of this machine to checkpoint and stop (a pod's preStop "
        "hook): create the stop file, then wait until they have returned.",
    )
    parser.add_argument(
        "--path",
        default=path_from(os.environ),
        help=f"the stop file (default: ${STOP_FILE_ENV}, else $TMPDIR/{DEFAULT_NAME})",
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=0.0,
        help="how long to wait for the trainers to return (default 0: do not wait)",
    )
    args = parser.parse_args(argv)
    request_stop(args.path)
    started = time.monotonic()
    left = wait_for_trainers(args.path, args.wait_s)
    waited = f"after {time.monotonic() - started:.0f}s"
    said = f"{len(left)} trainer(s) still running {waited}" if left else f"trainers done {waited}"
    print(f"[stop_file] created {args.path}; {said}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
