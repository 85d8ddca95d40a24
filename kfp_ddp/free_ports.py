"""Free TCP ports for the servers this package starts on one machine (the local launcher's
rendezvous, the local S3 server), picked where no outgoing connection and no other pick takes
them meanwhile.

A port is picked, then a process binds it a few seconds later (once Python and torch have
loaded). Two things can take it in those seconds:

* the kernel: a port that ``bind(("", 0))`` gives comes from its ephemeral range, the range it
  also takes the local port of every outgoing connection from (an S3 transfer, an API call). So
  the ports are picked at random below that range, where the kernel never gives one away by
  itself; ``bind(0)``'s only where the range is unknown (not Linux);
* another pick, in this process or another (parallel test workers, two local runs): a picked
  port is free until its server binds it, so a second pick could land on it. So every pick is
  written down, under a lock, in a folder of this user's in the temporary directory, and a port
  picked in the last :data:`RESERVED_SECONDS` is not picked again (see :func:`_reservations`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""The kernel's range for ports it picks by itself (Linux; 32768-60999 by default)."""
LOWEST = 20_000
"""Ports below are left alone: the well-known and registered ports other servers listen on, and
Ray's worker ports (10002-19999 by default: ``ray start`` refuses a port of its own in them)."""
TRIES_PER_PORT = 50
"""Random picks per port wanted before falling back to ``bind(0)``'s (all taken: unlikely)."""
RESERVED_SECONDS = 120.0
"""How long a picked port is left to the server it was picked for: more than a server takes to
start on a busy machine (Python, torch and a checkpoint load before the rendezvous binds)."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that were free a moment ago and that no other pick
    gave in the last :data:`RESERVED_SECONDS` (see the module). An address that is not this
    machine's raises :class:`OSError`."""
    _kernels_pick(host)  # an address not of this machine raises here, not in a loop
    candidates = _below_the_ephemeral_range()
    with _reservations() as taken:
        ports: list[int] = []
        for _ in range(count * TRIES_PER_PORT if candidates else 0):
            if len(ports) == count:
                break
            port = random.choice(candidates)
            if port not in taken and _bindable(host, port):
                taken.add(port)
                ports.append(port)
        while len(ports) < count:  # the kernel's pick
            port = _kernels_pick(host)
            if port not in taken:
                taken.add(port)
                ports.append(port)
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port on ``host`` that was free a moment ago (see :func:`free_ports`)."""
    return free_ports(1, host)[0]


def reservations_folder() -> Path:
    """Where this user's picks are written down (see :func:`_reservations`)."""
    return Path(tempfile.gettempdir()) / f"kfp-ddp-ports-{os.getuid()}"


def _below_the_ephemeral_range() -> range:
    """The ports from :data:`LOWEST` up to the kernel's ephemeral range (empty if unknown)."""
    try:
        lowest_ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST, lowest_ephemeral)


def _bindable(host: str, port: int) -> bool:
    """Whether ``port`` is free on ``host`` and on every address: a server listening on all
    addresses (the rendezvous store does) fails on a port another one holds on a single one."""
    for address in ("", host):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, port))
            except OSError:
                return False
    return True


def _kernels_pick(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _reservations() -> Iterator[set[int]]:
    """The ports picked on this machine by this user in the last :data:`RESERVED_SECONDS`, a
    file per port in :func:`reservations_folder`, read under an exclusive lock on the folder so
    that two picks never run at once; the ports the caller adds to the set are written down
    before the lock is let go. Older files are removed when read. Where the folder cannot be
    written (no temporary directory, a read-only one) or another user made it, the set starts
    empty and nothing is written: the picks are as free as the ports' binds say."""
    folder, lock = _locked_folder()
    try:
        taken = _recent_picks(folder) if folder else set()
        before = set(taken)
        yield taken
        for port in taken - before:
            with contextlib.suppress(OSError):  # a reservation fewer, as without the folder
                if folder is not None:
                    (folder / str(port)).touch()
    finally:
        if lock is not None:
            os.close(lock)  # lets the lock go


def _locked_folder() -> tuple[Path | None, int | None]:
    """:func:`reservations_folder` and its lock file's descriptor, locked; (None, None) where
    there is no temporary directory, it cannot be written, or another user made the folder."""
    try:
        folder = reservations_folder()  # raises where no temporary directory is usable
        folder.mkdir(mode=0o700, exist_ok=True)
        if folder.stat().st_uid != os.getuid():  # made by another user: not trusted
            return None, None
        lock = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None, None
    fcntl.flock(lock, fcntl.LOCK_EX)
    return folder, lock


def _recent_picks(folder: Path) -> set[int]:
    """The ports written down in ``folder`` in the last :data:`RESERVED_SECONDS`; older ones are
    removed."""
    oldest = time.time() - RESERVED_SECONDS
    recent: set[int] = set()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):  # gone meanwhile: not reserved
                if entry.stat().st_mtime >= oldest:
                    recent.add(int(entry.name))
                else:
                    os.unlink(entry.path)
    return recent
