"""Child processes that die with the process that started them, however it dies (``kill -9``).

The local backend's nodes and the local S3 server run in sessions of their own, so a parent
killed without a chance to stop them left them running: torchrun and its training processes
went on for minutes, writing their outputs, and SeaweedFS for good. Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``) sends the child SIGTERM when the parent's thread that started it is
gone: torchrun then stops its workers as on any SIGTERM, the trainer checkpoints and exits 143
as on a pod's deletion, and SeaweedFS shuts down. Elsewhere than Linux, nothing is set.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
"""Looked up here, in the launcher: the child between fork and exec only calls it."""


def die_with_this_process(
    *, new_session: bool = False, death_signal: signal.Signals = signal.SIGTERM
) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``death_signal`` (SIGTERM: it
    stops as it would on any) when the calling thread of this process ends (call it from the
    thread that also stops the child); ``new_session``: the child leads a session of its own too.
    SIGKILL for a child nobody would be there to kill when its SIGTERM hangs. None where there is
    nothing to do."""
    if _PRCTL is None and not new_session:
        return None
    return functools.partial(
        _set_parent_death_signal, _PRCTL, os.getpid(), new_session, death_signal
    )


def _set_parent_death_signal(
    prctl: Callable[..., int] | None,
    launcher: int,
    new_session: bool,
    death_signal: signal.Signals = signal.SIGTERM,
) -> None:  # pragma: no cover - runs in the child between fork and exec
    """In the child, before exec. If the parent died before the signal was set, the child is
    already an orphan and ends now."""
    if new_session:
        os.setsid()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, int(death_signal))
    if os.getppid() != launcher:
        os.kill(os.getpid(), death_signal)
