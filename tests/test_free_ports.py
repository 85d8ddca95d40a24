"""kfp_ddp.free_ports: ports for local servers, picked where outgoing connections never land and
no other pick takes them before their servers bind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
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


def _picks(monkeypatch, *ports: int) -> None:
    """The random picks free_ports makes, in order (the test fails if it asks for more)."""
    picks = iter(ports)
    monkeypatch.setattr(module.random, "choice", lambda _candidates: next(picks))


@pytest.fixture
def own_reservations(monkeypatch, tmp_path) -> Path:
    """A temporary directory of the test's own, so that its reservations are the test's alone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return module.reservations_folder()


def test_the_ports_are_distinct_free_and_below_the_kernels_ephemeral_range():
    ports = free_ports(12)
    low, _ = _ephemeral_range()
    assert len(set(ports)) == 12
    assert all(module.LOWEST <= port < low for port in ports), (ports, low)
    assert all(_bindable(port) for port in ports)
    assert module.LOWEST <= free_port() < low


def test_a_port_in_use_is_never_given(monkeypatch, tmp_path):
    other = free_port()  # reserved in the machine's folder, not in the test's own below
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", free_port()))
        listening.listen()
        taken = listening.getsockname()[1]
        _picks(monkeypatch, taken, taken, other)
        assert free_ports(1) == [other]


def test_a_port_in_use_on_another_address_is_never_given(monkeypatch, tmp_path):
    """The rendezvous store listens on every address: a port that a server holds on one address
    only (the local S3 server on a bridge's gateway) would fail it."""
    other = free_port()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as listening:
        listening.bind(("127.0.0.2", free_port()))  # all of 127/8 is this machine's loopback
        listening.listen()
        taken = listening.getsockname()[1]
        _picks(monkeypatch, taken, other)
        assert free_ports(1, host="127.0.0.1") == [other]


def test_a_port_another_process_picked_is_not_picked_again_until_its_reservation_ends(
    monkeypatch, own_reservations
):
    """The failure this prevents: a test worker picked a port for a trainer's rendezvous, another
    worker picked the same one before the trainer (seconds later) bound it: EADDRINUSE."""
    picked = subprocess.run(
        [sys.executable, "-c", "from kfp_ddp.free_ports import free_port; print(free_port())"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "TMPDIR": str(own_reservations.parent)},
    )  # fmt: skip
    theirs = int(picked.stdout)
    assert _bindable(theirs)  # free: only its reservation keeps it from another pick
    other = next(p for p in range(module.LOWEST, 30_000) if p != theirs and _bindable(p))
    _picks(monkeypatch, theirs, theirs, other)
    assert free_ports(1) == [other]

    expired = time.time() - module.RESERVED_SECONDS - 1
    os.utime(own_reservations / str(theirs), (expired, expired))
    (own_reservations / "12345").touch()
    os.utime(own_reservations / "12345", (expired, expired))
    _picks(monkeypatch, theirs)
    assert free_ports(1) == [theirs]
    assert not (own_reservations / "12345").exists()  # an expired reservation, removed when read


def test_one_call_never_gives_a_port_twice(monkeypatch, own_reservations):
    first, second = [p for p in range(module.LOWEST, 30_000) if _bindable(p)][:2]
    _picks(monkeypatch, first, first, second)
    assert free_ports(2) == [first, second]


def test_without_a_writable_temporary_directory_the_picks_still_work(monkeypatch, tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_folder))
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(_bindable(port) for port in ports)


def test_without_any_temporary_directory_the_picks_still_work(monkeypatch):
    def no_temporary_directory():
        raise FileNotFoundError("No usable temporary directory found in ['/tmp', ...]")

    monkeypatch.setattr(module.tempfile, "gettempdir", no_temporary_directory)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(_bindable(port) for port in ports)


def test_where_the_range_is_unknown_the_kernel_picks(monkeypatch, tmp_path):
    low, high = _ephemeral_range()
    monkeypatch.setattr(module, "EPHEMERAL_RANGE", Path(tmp_path / "absent"))
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(low <= port <= high for port in ports), ports
    assert all(_bindable(port) for port in ports)


def test_an_address_that_is_not_this_machines_is_an_error_not_a_wait():
    with pytest.raises(OSError):
        free_ports(1, host="203.0.113.7")  # TEST-NET-3: on no interface here
