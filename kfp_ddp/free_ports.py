"""Free TCP ports for the servers this package starts on one machine (the local launcher's
rendezvous, the local S3 server), picked where no outgoing connection takes them meanwhile.

A port is picked, then a process binds it a few seconds later (once Python and torch have
loaded). A port that ``bind(("", 0))`` gives comes from the kernel's ephemeral range, the range
it also takes the local port of every outgoing connection from: any connection this machine
opens in those seconds (an S3 transfer, an API call) may take it, and the server then fails with
"address already in use". So the ports are picked at random below that range, where the kernel
never gives one away by itself; ``bind(0)``'s only where the range is unknown (not Linux).
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""The kernel's range for ports it picks by itself (Linux; 32768-60999 by default)."""
LOWEST = 20_000
"""Ports below are left alone: the well-known and registered ports other servers listen on, and
Ray's worker ports (10002-19999 by default: ``ray start`` refuses a port of its own in them)."""
TRIES_PER_PORT = 50
"""Random picks per port wanted before falling back to ``bind(0)``'s (all taken: unlikely)."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that were free a moment ago (see the module)."""
    with contextlib.ExitStack() as held:  # held together: no port twice
        ports: list[int] = []

        def hold(port: int) -> None:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            with contextlib.suppress(OSError):  # taken: another pick
                sock.bind((host, port))
                ports.append(port)

        candidates = _below_the_ephemeral_range()
        for _ in range(count * TRIES_PER_PORT if candidates else 0):
            if len(ports) == count:
                break
            hold(random.choice(candidates))
        while len(ports) < count:  # the kernel's pick; an address not of this machine raises
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port on ``host`` that was free a moment ago (see the module)."""
    return free_ports(1, host)[0]


def _below_the_ephemeral_range() -> range:
    """The ports from :data:`LOWEST` up to the kernel's ephemeral range (empty if unknown)."""
    try:
        lowest_ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST, lowest_ephemeral)
