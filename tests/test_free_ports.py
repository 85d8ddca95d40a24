"""kfp_ddp.free_ports: ports for local servers, picked where outgoing connections never land."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kfp_ddp import free_ports as module
from kfp_ddp.free_ports import free_port, free_ports

pytestmark = pytest.mark.skipif(
    not module.EPHEMERAL_RANGE.is_file(), reason="no /proc/sys/net/ipv4/ip_local_port_range here"
)


def _ephemeral_range() -> tuple[int, int]:
    low, high = module.EPHEMERAL_RANGE.read_text().split()
    return int(low), int(high)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_ports_are_distinct_free_and_below_the_kernels_ephemeral_range():
    ports = free_ports(12)
    low, _ = _ephemeral_range()
    assert len(set(ports)) == 12
    assert all(module.LOWEST <= port < low for port in ports), (ports, low)
    assert all(_bindable(port) for port in ports)
    assert module.LOWEST <= free_port() < low


def test_a_port_in_use_is_never_given(monkeypatch):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", free_port()))
        listening.listen()
        taken = listening.getsockname()[1]
        other = free_port()
        picks = iter([taken, taken, other])
        monkeypatch.setattr(module.random, "choice", lambda _candidates: next(picks))
        assert free_ports(1) == [other]


def test_where_the_range_is_unknown_the_kernel_picks(monkeypatch, tmp_path):
    low, high = _ephemeral_range()
    monkeypatch.setattr(module, "EPHEMERAL_RANGE", Path(tmp_path / "absent"))
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(low <= port <= high for port in ports), ports
    assert all(_bindable(port) for port in ports)


def test_an_address_that_is_not_this_machines_is_an_error_not_a_wait():
    with pytest.raises(OSError):
        free_ports(1, host="203.0.113.7")  # TEST-NET-3: on no interface here
