"""``trainer.rendezvous_wait``: which store a node waits for; the wait itself on real sockets."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.trainer.trainer_launch import free_port
from trainer.rendezvous_wait import StoreEndpoint, store_to_wait_for, wait_for_store

TRAIN = ["-m", "trainer.train", "--help"]
PET = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_RDZV_BACKEND",
       "PET_RDZV_ENDPOINT", "PET_RDZV_CONF", "PET_RDZV_ID", "PET_STANDALONE")  # fmt: skip


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch):
    for name in PET:
        monkeypatch.delenv(name, raising=False)


def test_a_trainjob_node_above_rank_0_waits_for_node_0(monkeypatch):
    # As the Trainer's torch runtime sets them (static rendezvous at node 0).
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_NODE_RANK", "1")
    monkeypatch.setenv("PET_MASTER_ADDR", "job-node-0-0.job")
    monkeypatch.setenv("PET_MASTER_PORT", "29400")
    assert store_to_wait_for(TRAIN) == StoreEndpoint("job-node-0-0.job", 29400, 600.0)
    monkeypatch.setenv("PET_NODE_RANK", "0")
    assert store_to_wait_for(TRAIN) is None  # node 0 hosts the store


def test_a_workers_only_pytorchjob_waits_for_worker_0_unless_it_is_worker_0(monkeypatch):
    # As components/launcher/pytorchjob.py renders them.
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_RDZV_BACKEND", "c10d")
    monkeypatch.setenv("PET_RDZV_ENDPOINT", "job-worker-0:29400")
    expected = StoreEndpoint("job-worker-0", 29400, 600.0, may_be_here=True)
    assert store_to_wait_for(TRAIN) == expected
    monkeypatch.setenv("PET_RDZV_ENDPOINT", f"{socket.gethostname()}:29400")
    assert store_to_wait_for(TRAIN) is None  # this machine's name: torchrun hosts the store here


def test_whether_the_endpoint_is_this_machine_is_decided_without_resolving_it(monkeypatch):
    """One lookup fewer of a peer's name that may not exist yet (one took 15 s under load)."""
    looked_up = []
    real = socket.getaddrinfo

    def recorded(host, *args, **kwargs):
        looked_up.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recorded)
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_RDZV_BACKEND", "c10d")
    monkeypatch.setenv("PET_RDZV_ENDPOINT", "job-worker-0:29400")
    assert store_to_wait_for(TRAIN) is not None
    assert "job-worker-0" not in looked_up  # this machine's own name only: /etc/hosts


def test_a_name_that_resolves_to_this_machine_ends_the_wait_at_once():
    """Only known once the name resolves (a DNS alias of this machine): torchrun hosts the
    store, so there is nothing to wait for, and nothing listens yet."""
    said: list[str] = []
    here = StoreEndpoint(socket.gethostname(), free_port(), 30.0, may_be_here=True)
    began = time.monotonic()
    assert wait_for_store(here, say=said.append)
    assert time.monotonic() - began < 5 and said == []


def test_flags_and_rendezvous_conf_as_torchrun_reads_them():
    c10d = ["--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint"]
    expected = StoreEndpoint("peer", 29400, 600.0, may_be_here=True)
    assert store_to_wait_for([*c10d, "peer", *TRAIN]) == expected
    assert store_to_wait_for([*c10d, "127.0.0.1:5000", *TRAIN]) is None  # loopback: this machine
    conf = ["--rdzv-conf", "is_host=false,join_timeout=30"]
    expected = StoreEndpoint("127.0.0.1", 5000, 30.0)
    assert store_to_wait_for([*c10d, "127.0.0.1:5000", *conf, *TRAIN]) == expected
    conf = ["--rdzv-conf", "is_host=true"]
    assert store_to_wait_for([*c10d, "peer", *conf, *TRAIN]) is None

    static = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "node0", "--master-port"]
    assert store_to_wait_for([*static, "29555", *TRAIN]) == StoreEndpoint("node0", 29555, 600.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--standalone", "--nproc-per-node", "2", *TRAIN],  # one node: nobody to wait for
        ["--nnodes", "1", "--master-addr", "elsewhere", *TRAIN],
        ["--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "etcd:2379", *TRAIN],
        ["--nnodes", "two", "--node-rank", "1", *TRAIN],  # torchrun names the error itself
        ["--no-such-flag"],
        ["--help"],
    ],
)
def test_no_wait_where_torchrun_hosts_nothing_elsewhere_or_refuses_the_arguments(argv, capsys):
    assert store_to_wait_for(argv) is None
    assert capsys.readouterr() == ("", "")  # the usage and errors are torchrun's to print


def _listen_after(delay_s: float, port: int, ready: threading.Event) -> None:
    time.sleep(delay_s)
    with socket.create_server(("127.0.0.1", port)) as server:
        ready.set()
        server.settimeout(10)
        server.accept()[0].close()


def test_the_wait_ends_when_the_store_answers():
    port, ready = free_port(), threading.Event()
    listener = threading.Thread(target=_listen_after, args=(1.5, port, ready))
    listener.start()
    said: list[str] = []
    began = time.monotonic()
    assert wait_for_store(StoreEndpoint("127.0.0.1", port, 30.0), say=said.append)
    listener.join()
    assert ready.is_set() and 1.5 <= time.monotonic() - began < 10
    assert len(said) == 2, said
    assert said[0].startswith(f"[torchrun] waiting for the rendezvous store at 127.0.0.1:{port}")
    assert "ConnectionRefusedError" in said[0]
    assert said[1].startswith(f"[torchrun] the rendezvous store at 127.0.0.1:{port} answered")


def test_a_store_that_answers_at_once_costs_no_line():
    with socket.create_server(("127.0.0.1", 0)) as server:
        said: list[str] = []
        port = server.getsockname()[1]
        assert wait_for_store(StoreEndpoint("127.0.0.1", port, 30.0), say=said.append)
    assert said == []


@pytest.mark.parametrize("host", ["127.0.0.1", "no-such-node.invalid"])
def test_a_store_that_never_answers_is_given_up_after_the_join_timeout(host):
    said: list[str] = []
    now = [0.0]
    store = StoreEndpoint(host, free_port(), 5.0)
    assert not wait_for_store(
        store, say=said.append, clock=lambda: now[0], pause=lambda s: now.__setitem__(0, now[0] + s)
    )
    assert now[0] == 5.0  # tried each second until the join timeout
    assert said[-1].startswith(f"[torchrun] the rendezvous store at {store} did not answer in 5 s")
    assert said[-1].endswith("starting torchrun anyway")
