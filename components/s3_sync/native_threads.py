"""Waiting for the AWS CRT's native threads to end, so that a process may fork afterwards.

The CRT's threads (event loops, DNS resolvers) end asynchronously after the last reference
to their owner is gone, and an ended thread is joined lazily by the next one that starts. A
process that forks while one of them is ending hands the child a CRT whose bookkeeping names
a thread that does not exist there: the child's own threads then hung or crashed when they
ended. ``wait_ended`` makes the ending synchronous.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger("components.s3_sync")

_BEFORE_COLLECTING_S = 0.5
"""How long an owner may take to end before its last references are looked for in cycles."""
_JOIN_WAIT_S = 0.1
"""How long ``_join_ended_threads`` waits for the process's other CRT threads."""


def wait_ended(ended: list[threading.Event], *, timeout_s: float) -> bool:
    """Wait until every event in ``ended`` is set (the ``shutdown_event`` of CRT objects whose
    references the caller has dropped), then join the thread that ended last. False, with a
    warning, if the events took longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    if not ended[0].wait(_BEFORE_COLLECTING_S):
        gc.collect()  # an owner kept alive only by a reference cycle (e.g. a traceback's)
    for event in ended:
        if not event.wait(max(0.0, deadline - time.monotonic())):
            log.warning(
                "s3-sync: the AWS CRT's threads had not ended %.0f s after the sync; a fork "
                "now could crash the child",
                timeout_s,
            )
            return False
    return _join_ended_threads()


def _join_ended_threads() -> bool:
    """Join the CRT thread that ended last (the CRT joins each ended thread when the next one
    ends, so one is always left). It waits, up to ``_JOIN_WAIT_S``, for every other CRT thread
    of the process to be joined first: those of the sync that just ended take milliseconds;
    the time runs out only while another sync runs."""
    from awscrt.common import join_all_native_threads

    return join_all_native_threads(timeout_sec=_JOIN_WAIT_S)
