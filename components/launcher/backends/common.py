"""Pieces both backends share: prefixed log lines with a tail, and SIGTERM as an event."""

from __future__ import annotations

import collections
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator

from components.launcher.options import LogFn


def print_line(line: str) -> None:
    """Default log sink: one line to stdout, flushed (KFP shows step logs live)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class ReplicaLogs:
    """Prefixes each replica's lines (``[worker-1] ...``), keeps tails, notes the last activity."""

    def __init__(self, log: LogFn | None = None, *, tail: int = 50, per_replica: int = 200):
        self._log = log or print_line
        self._lock = threading.Lock()
        self._tail: collections.deque[str] = collections.deque(maxlen=tail)
        self._per_replica: dict[str, collections.deque[str]] = {}
        self._replica_len = per_replica
        self.last_line_at: float | None = None
        """time.monotonic() of the last replica line (None: nothing logged yet)."""

    def line(self, replica: str, text: str) -> None:
        text = text.rstrip("\r\n")
        prefixed = f"[{replica}] {text}"
        with self._lock:
            self._tail.append(prefixed)
            kept = self._per_replica.setdefault(
                replica, collections.deque(maxlen=self._replica_len)
            )
            kept.append(text)
            self.last_line_at = time.monotonic()
            self._log(prefixed)

    def note(self, text: str) -> None:
        """A launcher message (not a replica line): logged, not counted as replica activity."""
        with self._lock:
            self._log(f"[launcher] {text}")

    def tail(self) -> list[str]:
        with self._lock:
            return list(self._tail)

    def replica_tail(self, replica: str, lines: int = 20) -> list[str]:
        with self._lock:
            return list(self._per_replica.get(replica, ()))[-lines:]


@contextlib.contextmanager
def sigterm_event(enabled: bool = True) -> Iterator[threading.Event]:
    """An Event set on SIGTERM while inside the block (main thread only; else never set)."""
    event = threading.Event()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGTERM, previous)
