"""Local nodes die with their launcher, however it dies (``kill -9`` included).

A node runs in a session of its own (as a pod runs apart from whoever created it), so a launcher
killed without a chance to stop its nodes left them running: torchrun and its training
processes went on for minutes, writing their outputs. Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``) sends each node SIGTERM when the launcher's thread that started it
is gone: torchrun then stops its workers as it does on any SIGTERM, and the trainer checkpoints
and exits 143, as on a pod's deletion. Elsewhere than Linux, nothing is set.
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


def die_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when the calling thread
    of this process ends (call it from the thread that also stops the child). None where the
    signal does not exist."""
    if _PRCTL is None:
        return None
    return functools.partial(_set_parent_death_signal, _PRCTL, os.getpid())


def _set_parent_death_signal(prctl: Callable[..., int], launcher: int) -> None:
    """In the child, before exec. If the launcher died before the signal was set, the child
    is already an orphan and ends now."""
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != launcher:
        os.kill(os.getpid(), signal.SIGTERM)
