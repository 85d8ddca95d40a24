"""Fixtures of the real node (registered in tests/conftest.py); tests on it are marked ``node``.

* ``node_cluster`` (one per process at a time, reused by consecutive tests, stopped after the
  last): a whole control plane (the same parts as ``cluster``) with one real node
  (:class:`~tests.cluster.node.RealNode`), our CPU image and the pause image pushed to the
  tests' loopback registry (the node pulls them, as from any registry; the images the session's
  node tests name are pushed in the background, tests/cluster/node_images.py), and the test S3
  server on the node's address (pods reach it; nothing outside does); stopped two by two, then
  checked to have left nothing on the host (:meth:`~tests.cluster.node.RealNode.traces`: the
  last node test's teardown fails otherwise). The node's tests all run on one xdist worker
  (tests/node_scheduling.py), so one node serves them all; a host-wide lock makes any other
  session (a second worker, a second checkout's run) wait for that node to be gone, since two
  nodes would share the bridge, the ports and containerd's state;
* ``node_k8s``: a fresh namespace enforcing ``restricted`` on it, the launcher's ServiceAccount
  bound to the rendered Role there.

Root and the Debian packages (containerd, runc, containernetworking-plugins, podman, skopeo,
docker-registry) are needed, and the kubelet, kube-scheduler and CoreDNS binaries of
``../shared/envtest``; otherwise these tests skip, saying exactly what is missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import tarfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.assets import CONTROLLERS, CORE, HOW_TO_GET, find_binaries
from tests.cluster.control_plane import PARTS, ControlPlane, reference_missing
from tests.cluster.node import GATEWAY, NODE_BINARIES, RealNode, build_pause, missing
from tests.cluster.node_images import NodeImages, marked_images
from tests.cluster.plugin import Cluster, Namespace, namespace_on
from tests.cluster.processes import StartupError, stop_side_by_side

NODE_PARTS = (*PARTS, "mpi-operator")
"""The node's plane runs the MPI Operator too: its host-wide lock makes it the only plane here
that binds the operator's fixed health port."""

NODE_NAME = "node-0"
PAUSE_TAG = "pause:kfp-ddp-test"
HOST_LOCK = Path("/run/lock/kfp-ddp-real-node.lock")
"""Held while a real node runs: one per host (one bridge, one set of ports, one containerd)."""
LOCK_WAIT_S = 420.0


@dataclass
class NodeCluster:
    """A control plane with a real node, the image its pods run, the S3 server they reach."""

    cluster: Cluster
    node: RealNode
    image: str
    """Our CPU image, by its name in the loopback registry (what pods pull)."""
    s3: object
    root_image: str
    """An image whose user is root (the pause image): refused under runAsNonRoot."""
    images: NodeImages
    """The other images the node's tests run (``pushed(NAME)``; tests/cluster/node_images.py)."""

    @property
    def plane(self) -> ControlPlane:
        return self.cluster.plane


def pause_archive(binary: Path, path: Path) -> Path:
    """The pause image as an OCI archive: one layer with ``/pause``, its entrypoint."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode = binary.stat().st_size, 0o755
        tar.addfile(info, io.BytesIO(binary.read_bytes()))
    layer_data = layer.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(layer_data).hexdigest()],
        },
    }
    with tarfile.open(path, "w") as layout:

        def blob(data: bytes) -> dict:
            digest = hashlib.sha256(data).hexdigest()
            info = tarfile.TarInfo(f"blobs/sha256/{digest}")
            info.size = len(data)
            layout.addfile(info, io.BytesIO(data))
            return {"digest": f"sha256:{digest}", "size": len(data)}

        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                **blob(json.dumps(config).encode()),
            },
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer_data)}],
        }
        top = {"mediaType": manifest["mediaType"], **blob(json.dumps(manifest).encode())}
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps({"schemaVersion": 2, "manifests": [top]}).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            layout.addfile(info, io.BytesIO(data))
    return path


@contextmanager
def host_lock(path: Path = HOST_LOCK, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """The real node's host-wide lock, waited for at most ``wait_s`` (then the test fails,
    naming who holds it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    pytest.fail(
                        f"another test session holds the real node ({path}: "
                        f"{lock.read().strip() or 'unknown'}) for over {wait_s:.0f} s; "
                        "one node runs per host: wait for it or stop that session"
                    )
                time.sleep(2)
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)


class RunningNode:
    """The process's real node: started by the first test that asks for it, stopped after the
    last (when the next test does not ask for it; :func:`pytest_runtest_teardown`), so it costs
    nothing while the worker's other tests run. The node's tests come one after another
    (tests/node_scheduling.py; ``pytest_collection_modifyitems`` without xdist)."""

    def __init__(self) -> None:
        self.cluster: NodeCluster | None = None
        self.failure: str | None = None
        self._stack = ExitStack()

    def get(self, request, tmp_path_factory, podman, cpu_image, oci_registry) -> NodeCluster:
        if self.failure is not None:
            pytest.fail(f"the real node did not start (see the first node test): {self.failure}")
        if self.cluster is None:
            binaries = _binaries_or_skip()
            try:
                self._stack.enter_context(host_lock())
                images = marked_images(request.session.items)
                self.cluster = self._stack.enter_context(
                    started_node(
                        tmp_path_factory, podman, cpu_image, oci_registry, binaries, images
                    )
                )
            except BaseException as exc:
                self.failure = f"{type(exc).__name__}: {str(exc)[:300]}"
                self.stop()
                raise
        return self.cluster

    def stop(self) -> None:
        self.cluster = None
        self._stack.close()


RUNNING = RunningNode()


@pytest.fixture
def node_cluster(request, tmp_path_factory, podman, cpu_image, oci_registry) -> NodeCluster:
    """The real node's cluster (one per process at a time, reused by consecutive tests)."""
    return RUNNING.get(request, tmp_path_factory, podman, cpu_image, oci_registry)


@pytest.fixture(scope="module")
def node_cluster_for_module(
    request, tmp_path_factory, podman, cpu_image, oci_registry
) -> NodeCluster:
    """The same node, for a module's own fixtures (e.g. jobs started together, judged by
    separate tests, which still ask for ``node_cluster``)."""
    return RUNNING.get(request, tmp_path_factory, podman, cpu_image, oci_registry)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield  # the test's own fixtures (its namespace) are gone by now
    if RUNNING.cluster is not None and (
        nextitem is None or "node_cluster" not in getattr(nextitem, "fixturenames", ())
    ):
        node = RUNNING.cluster.node
        RUNNING.stop()
        left = node.traces()
        if left:  # this test's teardown fails, naming them
            raise AssertionError("the real node left on the host: " + "; ".join(left))


def pytest_sessionfinish() -> None:
    RUNNING.stop()  # interrupted mid-way: nothing left running


def _binaries_or_skip():
    reason = missing()
    if reason:
        pytest.skip(reason)
    binaries = find_binaries((*CORE, *CONTROLLERS, *NODE_BINARIES))
    absent = binaries.missing((*CORE, *CONTROLLERS, *NODE_BINARIES))
    if absent:
        pytest.skip(f"no {', '.join(absent)} for the real node: {HOW_TO_GET}")
    if reference_missing():
        pytest.skip("the official CRDs/configs are not there: put ../shared beside the repository")
    return binaries


@contextmanager
def started_node(tmp_path_factory, podman, cpu_image, oci_registry, binaries, image_names):
    """A control plane with the real node, the images pushed, the S3 server; stopped on exit."""
    folder = tmp_path_factory.mktemp("real-node")
    pause = oci_registry.push_oci_archive(
        pause_archive(build_pause(folder), folder / "pause.tar"), PAUSE_TAG
    )
    # Our image, then those of the session's node tests, go to the registry while the control
    # plane starts and the first tests run (the node pulls them later).
    images = NodeImages(podman, cpu_image, oci_registry, folder / "images")
    images.start(["cpu", *image_names])
    plane = node = s3 = None
    try:
        for attempt in range(1, 4):
            plane = ControlPlane(
                folder / f"plane-{attempt}", binaries, parts=NODE_PARTS, node_name=NODE_NAME
            )
            try:
                plane.start()
                break
            except StartupError as exc:
                if "address already in use" not in str(exc) or attempt == 3:
                    raise
        node = RealNode(
            plane, folder / "node", binaries["kubelet"], binaries["kube-scheduler"],
            binaries["coredns"], registry=oci_registry.host, pause_image=pause,
        ).start()  # fmt: skip
        from kfp_ddp.local_s3 import LocalS3Server

        s3 = LocalS3Server(host=GATEWAY).start()
        cluster = Cluster(plane, None)  # type: ignore[arg-type] - no played kubelet here
        yield NodeCluster(cluster, node, images.pushed("cpu"), s3, root_image=pause, images=images)
    finally:
        images.close()  # no push left running
        # Two by two (5 s one after another): the S3 server and the node's processes (~1.5
        # and 0.4-2.2 s), then the plane and the node's bridge. A weed whose address went away
        # takes 10 s to stop, an API server whose kubelet still watches 5 s instead of 1.2.
        first = [s3.stop] if s3 is not None else []
        then = [plane.stop] if plane is not None else []
        if node is not None:
            first.append(node.stop_processes)
            then.append(node.remove_traces)
        try:
            stop_side_by_side(first)
        finally:
            stop_side_by_side(then)


@pytest.fixture
def node_k8s(node_cluster: NodeCluster, request: pytest.FixtureRequest) -> Iterator[Namespace]:
    """A fresh namespace enforcing ``restricted`` on the plane with the real node."""
    yield from namespace_on(node_cluster.cluster, request, pod_security="restricted")
