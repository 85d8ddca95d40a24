"""One local run at a time in a workspace: its nodes' folders are the workspace's.

Two ``kfp-ddp run-local`` (or ``make demo``) runs in one workspace share ``nodes/<replica>``: a
node's ``TMPDIR`` there is emptied when it stops, under the other run's node, and both stage
into the same folders. So a run holds the workspace (``flock`` on a file in it, released by
the kernel however the process ends) and a second one is refused, naming the first's pid.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from kfp_ddp import pid_lock

LOCK_FILE = ".kfp-ddp-run.lock"


class WorkspaceBusy(RuntimeError):
    """Another local run holds the workspace."""


@contextlib.contextmanager
def held_workspace(workspace: Path) -> Iterator[None]:
    """Hold ``workspace`` (an existing folder) while the block runs; WorkspaceBusy if another
    process holds it."""
    try:
        fd = pid_lock.hold(workspace / LOCK_FILE)
    except pid_lock.LockHeld as held:
        raise WorkspaceBusy(
            f"the workspace {workspace} is in use by another local run (pid {held.holder}); wait "
            "for it to end, or give this run a workspace of its own (--workspace, or the "
            "demo's --output)"
        ) from None
    try:
        yield
    finally:
        os.close(fd)  # releases the lock
