"""Progress of a sync: files, bytes, rate and ETA — a tqdm bar on a TTY, log lines otherwise."""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("components.s3_sync")

LOG_EVERY_S = 5.0
"""Seconds between two progress log lines when stderr is not a terminal."""


def format_bytes(n: float) -> str:
    """``1.50MB``: tqdm's byte counts (powers of 1024)."""
    from tqdm import tqdm

    return tqdm.format_sizeof(n, "B", 1024)


class Progress:
    """Thread-safe counters fed by the transfer callbacks.

    ``mode``: True → tqdm bar (bytes), False → periodic log lines, None → bar if stderr is a TTY.
    """

    def __init__(self, *, total_files: int, total_bytes: int, mode: bool | None = None) -> None:
        self.total_files = total_files
        self.total_bytes = total_bytes
        self.files = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._last_log = self.started
        self._lock = threading.Lock()
        use_bar = sys.stderr.isatty() if mode is None else mode
        self._bar = None
        if use_bar:
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - tqdm is a dependency; degrade to logs
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=total_bytes,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc="s3-sync",
                    file=sys.stderr,
                    dynamic_ncols=True,
                )
                self._bar.set_postfix_str(f"0/{total_files} files", refresh=False)

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += n
            if self._bar is not None:
                self._bar.update(n)
            self._maybe_log()

    def file_done(self) -> None:
        with self._lock:
            self.files += 1
            if self._bar is not None:
                self._bar.set_postfix_str(f"{self.files}/{self.total_files} files", refresh=False)
            self._maybe_log()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.bytes / elapsed
        left = max(self.total_bytes - self.bytes, 0)
        if rate > 0:
            eta = f"{left / rate:.0f}s"
        elif self.files:
            eta = f"{(self.total_files - self.files) * elapsed / self.files:.0f}s"
        else:
            eta = "?"
        return (
            f"s3-sync: {self.files}/{self.total_files} files, {format_bytes(self.bytes)}/"
            f"{format_bytes(self.total_bytes)}, {format_bytes(rate)}/s, ETA {eta}"
        )

    def _maybe_log(self) -> None:
        if self._bar is not None:
            return
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.info(self.line())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif time.monotonic() - self.started >= LOG_EVERY_S:
            log.info(self.line())
