"""Pytest fixtures of the real control plane (registered in tests/conftest.py).

- ``cluster`` (one per test process at a time; with xdist the tests that use a plane all run on
  one worker, one after another, tests/node_scheduling.py, so one per session): the whole plane
  — API server, controller-manager, JobSet, Kubeflow Trainer, Training Operator, the Prometheus
  Operator's CRDs — and its kubelet.
- ``clusters``: planes with fewer parts, started on first use (a cluster that serves only the
  Training Operator's APIs, or none, for discovery tests). Every plane stops after the last test
  of the files that use one (:func:`pytest_runtest_teardown`).
- ``k8s``: a fresh namespace of ``cluster`` per test, the launcher's ServiceAccount bound to the
  rendered Role there, and the test's kubelet scenarios (their errors fail the test).

Missing binaries or reference files skip the tests that need them, saying how to get them; a
plane that fails to start fails them, with the failing component's log tail.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.accounts import launcher_configuration
from tests.cluster.assets import HOW_TO_GET, find_binaries
from tests.cluster.control_plane import PARTS, ControlPlane, reference_missing
from tests.cluster.kubelet import FakeKubelet
from tests.cluster.play import JobPods, Play
from tests.cluster.processes import StartupError, stop_side_by_side
from tests.node_scheduling import file_of, uses_a_plane

POD_SECURITY = "pod-security.kubernetes.io/enforce"
OPERATOR_ONLY = ("controller-manager", "training-operator")
"""A cluster on the Training Operator v1 only (no Kubeflow Trainer, no Prometheus Operator). Its
operator runs as an admin would set it up for restricted namespaces: with our init-pytorch
template (components/launcher/pytorch_init_container.yaml)."""
PYTORCH_INIT_TEMPLATE = (
    Path(__file__).resolve().parents[2] / "components" / "launcher" / "pytorch_init_container.yaml"
)
PORT_ATTEMPTS = 3
"""Starts of a plane whose component found its port taken (ports are picked before binding)."""
BARE = ()
"""An API server alone: a test installs the CRDs it wants served (``serve_only``)."""
CHILD_POD_MAKERS = (
    ("jobset.x-k8s.io", "v1alpha2", "jobsets"),  # a TrainJob's
    ("ray.io", "v1", "rayclusters"),  # a RayJob's
)
"""Custom resources that a training job's controller makes and that make pods in turn."""


@dataclass
class Cluster:
    """A started plane and its kubelet."""

    plane: ControlPlane
    kubelet: FakeKubelet

    def clients(self) -> Any:
        return self.plane.admin_client()

    def create_namespace(
        self, hint: str, *, pod_security: str | None = None, labels: dict[str, str] | None = None
    ) -> str:
        """A new namespace (``pod_security``: the level it enforces, e.g. ``restricted``)."""
        from kubernetes import client

        base = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:45].strip("-") or "t"
        name = f"{base}-{secrets.token_hex(3)}"
        labels = dict(labels or {})
        if pod_security:
            labels[POD_SECURITY] = pod_security
            labels[f"{POD_SECURITY}-version"] = "latest"
        client.CoreV1Api(self.clients()).create_namespace(
            {"metadata": {"name": name, "labels": labels}}
        )
        return name

    def clear_namespace(self, name: str) -> None:
        """Delete what a test left running in namespace ``name``: every object that makes pods,
        then its pods, at once. The namespace itself stays until the plane stops.

        The pod makers go first, each kind itself: the training jobs, and what their controllers
        made that makes pods in turn (JobSets, batch Jobs, Ray clusters). Left to the garbage
        collector, a child outlives its job for a moment and makes again the pods deleted
        meanwhile (seen: a RayJob's Ray cluster started its head and workers again, which held
        the node's memory while the next test's pods waited 16 s to be scheduled). The pods get
        no grace period: a test is over, and left graceful, a real node's pods would spend the
        next test's first half-minute on their SIGTERM (a trainer's checkpoint and upload, Ray
        draining its node) on the same 2 cores.

        Deleting the namespace instead would make the namespace controller list and delete every
        resource type the plane serves (~45 of them: ~90 requests, measured at ~0.28 s of CPU of
        the API server and controller-manager a namespace, ~17 % of what the 64 tests of
        test_k8s_backend.py cost the machine) to remove a ServiceAccount, a Role and a Secret
        that cost nothing where they are."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        from components.launcher.apis import JOB_APIS

        jobs = [(api.group, api.version, api.plural) for api in JOB_APIS.values()]
        admin = self.clients()
        custom = client.CustomObjectsApi(admin)
        for group, version, plural in (*jobs, *CHILD_POD_MAKERS):
            try:
                custom.delete_collection_namespaced_custom_object(
                    group, version, name, plural, propagation_policy="Background"
                )
            except ApiException as exc:
                if exc.status != 404:  # an API this plane does not serve
                    raise
        client.BatchV1Api(admin).delete_collection_namespaced_job(
            name, propagation_policy="Background"
        )
        client.CoreV1Api(admin).delete_collection_namespaced_pod(name, grace_period_seconds=0)

    def stop(self) -> None:
        self.kubelet.stop()
        self.plane.stop()


@dataclass
class Clusters:
    """Planes by their parts, started on first use, stopped at the end of the session."""

    folder: Path
    started: dict[tuple[str, ...], Cluster | BaseException] = field(default_factory=dict)
    stops: int = 0
    """How many times :meth:`stop_all` ran: a plane started again gets a folder of its own."""

    def get(self, parts: tuple[str, ...] = PARTS) -> Cluster:
        if parts not in self.started:
            self.started[parts] = self._start(parts)
        found = self.started[parts]
        if isinstance(found, BaseException):
            raise found  # started once, failed: every test that needs it fails alike
        return found

    def _start(self, parts: tuple[str, ...]) -> Cluster | BaseException:
        binaries = find_binaries()
        folder = self.folder / f"{'-'.join(parts) or 'bare'}-{self.stops}"
        template = PYTORCH_INIT_TEMPLATE if parts == OPERATOR_ONLY else None
        missing = binaries.missing(ControlPlane(folder, binaries, parts=parts).needs())
        if missing:
            pytest.skip(f"no {', '.join(missing)} for the test control plane: {HOW_TO_GET}")
        absent = reference_missing()
        if absent:
            pytest.skip(
                f"the official CRDs/configs are not there ({absent[0]}, …): put ../shared "
                "(reference/, envtest/config/) beside the repository"
            )
        for attempt in range(1, PORT_ATTEMPTS + 1):
            plane = ControlPlane(
                folder / f"attempt-{attempt}", binaries, parts=parts, pytorch_init_template=template
            )
            try:
                plane.start()
                return Cluster(plane, FakeKubelet(plane).start())
            except StartupError as exc:
                # The ports were free when picked, but another process (a test's outgoing
                # connection, the other pytest worker's plane) may take one before a component
                # binds it: pick new ones. Any other startup failure is kept as it is.
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    return exc
            except Exception as exc:  # noqa: BLE001 - kept: later tests fail with the same cause
                return exc
        raise AssertionError("unreachable")

    def stop_all(self) -> None:
        """Stop every started plane, side by side (each API server takes seconds to shut down);
        a test that asks for one afterwards starts it again."""
        stop_side_by_side(
            [found.stop for found in self.started.values() if isinstance(found, Cluster)]
        )
        self.started.clear()
        self.stops += 1


SESSION_PLANES: list[Clusters] = []
"""The ``clusters`` fixture's registry while the session has it, for
:func:`pytest_runtest_teardown`."""


@pytest.fixture(scope="session")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    registry = Clusters(tmp_path_factory.mktemp("control-planes"))
    SESSION_PLANES.append(registry)
    yield registry
    SESSION_PLANES.remove(registry)
    registry.stop_all()


@pytest.fixture
def cluster(clusters: Clusters) -> Cluster:
    """The whole control plane of this test process."""
    return clusters.get(PARTS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Stop the planes after the last test of the files that use one, instead of at the end of
    the session: idle, the three planes take ~8 % of a core (measured over the 200 s a full run
    went on after its last plane test). Those files' tests come one after another (on one xdist
    worker, tests/node_scheduling.py; ``pytest_collection_modifyitems`` without xdist)."""
    yield  # the test's own fixtures (its namespace; a module's, at its last test) are gone
    next_file = None if nextitem is None else file_of(nextitem.nodeid)
    if next_file is None or not uses_a_plane(item.config.rootpath / next_file):
        for registry in SESSION_PLANES:
            if registry.started:
                registry.stop_all()


@dataclass
class Namespace:
    """One test's namespace on a plane: the launcher's account there, the test's kubelet play."""

    cluster: Cluster
    name: str
    play: Play = field(default_factory=Play)
    _configuration: Any = None

    @property
    def kubelet(self) -> FakeKubelet:
        return self.cluster.kubelet

    def launcher_configuration(self, **kw: Any) -> Any:
        """The client Configuration of the launcher's ServiceAccount (the rendered Role)."""
        if kw:
            return launcher_configuration(self.cluster.plane, self.name, **kw)
        if self._configuration is None:
            self._configuration = launcher_configuration(self.cluster.plane, self.name)
        return self._configuration

    def admin(self) -> Any:
        return self.cluster.clients()

    def job(self, api: str, name: str) -> JobPods:
        return JobPods(self.kubelet, self.name, api, name)

    def scenario(self, api: str, name: str, scenario: Callable[[JobPods], None]) -> JobPods:
        """Play ``scenario`` (the kubelet's part) for job ``name`` of ``api`` in a thread."""
        pods = self.job(api, name)
        self.play.start(scenario, pods)
        return pods


@contextmanager
def new_namespace(cluster: Cluster, hint: str, **kw: Any) -> Iterator[Namespace]:
    """A namespace named after ``hint`` (``kw``: :meth:`Cluster.create_namespace`'s), its
    kubelet play checked, then cleared (:meth:`Cluster.clear_namespace`)."""
    namespace = Namespace(cluster, cluster.create_namespace(hint, **kw))
    try:
        yield namespace
        namespace.play.check()
    finally:
        for pods in namespace.play.scenarios:
            pods.stopped.set()
        cluster.clear_namespace(namespace.name)


def namespace_on(
    cluster: Cluster, request: pytest.FixtureRequest, **kw: Any
) -> Iterator[Namespace]:
    with new_namespace(cluster, request.node.name, **kw) as namespace:
        yield namespace


@pytest.fixture
def k8s(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Namespace]:
    """A fresh namespace of the whole plane for this test."""
    yield from namespace_on(cluster, request)


@pytest.fixture
def operator_k8s(clusters: Clusters, request: pytest.FixtureRequest) -> Iterator[Namespace]:
    """A namespace on a cluster that serves only the Training Operator's PyTorchJob and TFJob."""
    yield from namespace_on(clusters.get(OPERATOR_ONLY), request)


@pytest.fixture
def bare_k8s(clusters: Clusters, request: pytest.FixtureRequest) -> Iterator[Namespace]:
    """A namespace on an API server without controllers; ``serve_only`` picks its job CRDs."""
    yield from namespace_on(clusters.get(BARE), request)
