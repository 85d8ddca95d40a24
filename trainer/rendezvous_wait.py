"""Before torchrun starts: wait until the node that hosts the rendezvous store accepts connections.

torchrun's TCP store client connects once and waits out its whole ``read_timeout`` (60 s) when
the address does not answer at all. That is what a restarted pod meets on Kubernetes: its
peer's replacement is not up yet and the peer's Service name still resolves to the address of
the pod that was deleted, whose packets go nowhere. On a real node, 5 of 18 PyTorchJob restarts
lost ~50 s each that way; a shorter ``read_timeout`` only made torchrun give up and the pod
restart again.

So a node that connects to the store as a client first probes it: a plain TCP connect of at
most :data:`CONNECT_TIMEOUT_S`, the name resolved once on every try (a lookup that fails is
usually instant, 0.01 s in a pod of the test node, but one took 15 s there under load), a pause of
:data:`RETRY_PAUSE_S` between tries, for at most the rendezvous' join timeout (torchrun's
``join_timeout``, 600 s by default: how long a node waits for the others). A connection that is
opened and closed without a word is harmless to the store. When the store never answers,
torchrun starts anyway and fails as it would have (``trainer.torchrun`` exits 200: retryable).

Which node hosts the store is torchrun's own rule: with ``--rdzv-backend c10d`` the node whose
host name or address is the endpoint's (or ``is_host`` in ``--rdzv-conf``), with the static
rendezvous node rank 0 at ``--master-addr``.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

CONNECT_TIMEOUT_S = 2.0
"""One connect attempt: an address that answers does so in milliseconds, even across nodes."""
RETRY_PAUSE_S = 1.0
DEFAULT_JOIN_TIMEOUT_S = 600
"""torchrun's default ``join_timeout``."""
C10D_DEFAULT_PORT = 29400


@dataclass(frozen=True)
class StoreEndpoint:
    """Where this node's torchrun will connect to the rendezvous store, and for how long to wait."""

    host: str
    port: int
    wait_s: float
    may_be_here: bool = False
    """c10d without ``is_host``: torchrun hosts the store here if ``host`` resolves to this
    machine, which can be known only once the name resolves (checked on every try)."""

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def store_to_wait_for(argv: list[str]) -> StoreEndpoint | None:
    """The store this node connects to as a client; None when it hosts it, runs alone, or the
    arguments are not torchrun's (torchrun then says what is wrong with them itself)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config
    from torch.distributed.run import parse_args, parse_min_max_nnodes

    try:  # quietly, and as torchrun reads them: it prints the usage or the error itself
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = parse_args(argv)
        min_nodes, max_nodes = parse_min_max_nnodes(args.nnodes)
        conf = RendezvousParameters(
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id, min_nodes, max_nodes,
            **_parse_rendezvous_config(args.rdzv_conf),
        )  # fmt: skip
        wait_s = float(conf.get_as_int("join_timeout") or DEFAULT_JOIN_TIMEOUT_S)
        is_host = conf.get_as_bool("is_host")
    except (SystemExit, ValueError, RuntimeError):
        return None
    if args.standalone or max_nodes <= 1:
        return None
    if args.rdzv_backend == "static":
        if args.node_rank == 0:
            return None
        endpoint = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port}"
        return _endpoint(endpoint, args.master_port, wait_s)
    if args.rdzv_backend != "c10d":
        return None  # etcd: its own servers, its own retries
    store = _endpoint(args.rdzv_endpoint, C10D_DEFAULT_PORT, wait_s)
    if store is None:
        return None
    if is_host is not None:
        return None if is_host else store
    if names_this_machine(store.host):
        return None
    return replace(store, may_be_here=True)


def names_this_machine(host: str) -> bool:
    """Whether ``host`` is this machine by its name, its canonical name or an address literal:
    torchrun's own test (``_matches_machine_hostname``) short of resolving ``host``. Resolving a
    name that does not exist yet (the peer's pod is being replaced) is one more lookup that can be
    slow under load."""
    if host == "localhost" or host == socket.gethostname():
        return True
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None and literal.is_loopback:
        return True
    try:
        mine = socket.getaddrinfo(
            socket.gethostname(), None, proto=socket.IPPROTO_TCP, flags=socket.AI_CANONNAME
        )
    except OSError:
        return False
    return any(info[3] == host or (literal and info[4][0] == str(literal)) for info in mine)


def hosts_the_store(host: str) -> bool:
    """torchrun's own test of whether ``host`` is this machine, ``host`` resolved; when that test
    cannot be found, assume it is (no wait: what torchrun did before)."""
    try:
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname
    except ImportError:
        return True
    return bool(_matches_machine_hostname(host))


def wait_for_store(
    store: StoreEndpoint,
    *,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> bool:
    """Connect to ``store`` until it accepts (True) or ``store.wait_s`` has passed (False)."""
    began = clock()
    failures = 0
    while True:
        try:
            here = _try(store)
        except OSError as err:  # refused, timed out, unreachable, not (yet) in DNS
            failures += 1
            if failures == 1:
                say(
                    f"[torchrun] waiting for the rendezvous store at {store} (not answering yet: "
                    f"{_reason(err)}); its node may still be starting"
                )
            if clock() - began >= store.wait_s:
                say(
                    f"[torchrun] the rendezvous store at {store} did not answer in "
                    f"{store.wait_s:.0f} s (last: {_reason(err)}); starting torchrun anyway"
                )
                return False
            pause(RETRY_PAUSE_S)
            continue
        if here:
            if failures:
                say(f"[torchrun] {store.host} is this machine: torchrun hosts the store here")
        elif failures:
            waited = clock() - began
            say(f"[torchrun] the rendezvous store at {store} answered after {waited:.0f} s")
        return True


def _try(store: StoreEndpoint) -> bool:
    """One try: resolve the name once, then connect to its addresses. True when the name turns
    out to be this machine's (torchrun will host the store); OSError when nothing answers."""
    addresses = socket.getaddrinfo(store.host, store.port, type=socket.SOCK_STREAM)
    if store.may_be_here and hosts_the_store(store.host):
        return True
    failure: OSError = ConnectionRefusedError(f"no address of {store.host} accepted")
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock.connect(address)
                return False
        except OSError as err:
            failure = err
    raise failure


def _reason(err: OSError) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _endpoint(endpoint: str | None, default_port: int, wait_s: float) -> StoreEndpoint | None:
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if not endpoint:
        return None
    host, port = parse_rendezvous_endpoint(endpoint, default_port=default_port)
    return StoreEndpoint(host, port, wait_s)
