"""A real control plane on loopback: ``ControlPlane(folder, binaries, parts=...).start()``.

Starts etcd and kube-apiserver (token auth, ``--authorization-mode=RBAC``, Pod Security admission
on), installs the official CRDs of the parts asked for, then the controllers with their webhooks:
kube-controller-manager (Jobs, garbage collection, namespaces, service accounts), the JobSet
controller, the Kubeflow Trainer v2.3 controller (TrainJob → JobSet; the ``torch-distributed``
ClusterTrainingRuntime is installed) and the Training Operator v1.9 (PyTorchJob, TFJob). Every
listener is on 127.0.0.1 on a free port; every webhook configuration is the official one,
rewritten from an in-cluster ``service:`` to ``url: https://127.0.0.1:PORT/…`` with our CA.
The test reaches it as admin (``admin_configuration``) or as a ServiceAccount (``accounts.py``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kfp_ddp.free_ports import free_ports
from tests.cluster import certs
from tests.cluster.assets import CONTROLLERS, CORE, Binaries
from tests.cluster.processes import Component, StartupError

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
ENVTEST_CONFIG = Path(__file__).resolve().parents[3] / "shared" / "envtest" / "config"
TRAINER = REFERENCE / "trainer-v2.3.0"
JOBSET = REFERENCE / "jobset-v0.12.0"
OPERATOR = REFERENCE / "training-operator-v1.9"
PROMETHEUS = REFERENCE / "prometheus-operator-v0.93"
KUBERAY = REFERENCE / "kuberay-v1.7.0"
MPI_OPERATOR = REFERENCE / "mpi-operator-v0.8.0"
ARGO_WORKFLOWS = REFERENCE / "argo-workflows-v4.0.8" / "argoproj.io_workflows.full.yaml"

CRD_FILES = {
    "jobset": [JOBSET / "jobset.x-k8s.io_jobsets.yaml"],
    "trainer": [
        TRAINER / "trainer.kubeflow.org_trainjobs.yaml",
        TRAINER / "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        TRAINER / "trainer.kubeflow.org_trainingruntimes.yaml",
    ],
    "pytorchjob": [REFERENCE / "kubeflow.org_pytorchjobs.yaml"],
    "tfjob": [OPERATOR / "kubeflow.org_tfjobs.yaml"],
    "xgboostjob": [OPERATOR / "kubeflow.org_xgboostjobs.yaml"],
    "kuberay": [KUBERAY / "ray.io_rayclusters.yaml", KUBERAY / "ray.io_rayjobs.yaml"],
    "mpijob": [MPI_OPERATOR / "kubeflow.org_mpijobs.yaml"],
    "monitoring": sorted(PROMETHEUS.glob("monitoring.coreos.com_*.yaml")),
    "argo": [ARGO_WORKFLOWS],
}
"""The official CRDs, by the part that needs them."""
RAYSERVICE_STAND_IN = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "rayservices.ray.io"},
    "spec": {
        "group": "ray.io",
        "names": {
            "kind": "RayService",
            "listKind": "RayServiceList",
            "plural": "rayservices",
            "singular": "rayservice",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
                "subresources": {"status": {}},
            }
        ],
    },
}
"""The KubeRay operator also watches RayServices, and exits when their informer cannot sync
(2 minutes after it starts); the reference has no RayService CRD, so a ``kuberay`` plane serves
this schemaless stand-in. No test creates a RayService."""

OPERATOR_SCHEMES = ("pytorchjob", "tfjob", "xgboostjob")
"""The Training Operator's job kinds a plane serves (its --enable-scheme flags and their CRDs)."""
PARTS = ("controller-manager", "trainer", "training-operator", "kuberay", "monitoring")
"""What a plane runs by default: ``trainer`` brings JobSet too; ``training-operator`` serves
PyTorchJob, TFJob and XGBoostJob, and the MPI Operator's MPIJob CRD (``kubeflow.org/v2beta1``,
the same CRD name as the operator's old v1 MPIJob, which it does not serve here) without an
operator, for played MPIJobs; ``mpi-operator`` (not a default: see ``MPI_OPERATOR_HEALTH``) runs
the MPI Operator v0.8.0 itself; ``kuberay`` is the KubeRay operator v1.7.0 (RayJob, RayCluster);
``monitoring`` installs the Prometheus Operator's CRDs (no operator runs). A plane of no parts
(an API server alone) runs without the API server's watch cache: its watches read etcd
directly, so ``compact_etcd`` makes an older resourceVersion answer 410 Gone."""

MPI_OPERATOR_HEALTH = 8080
"""The MPI Operator v0.8.0 serves /healthz on :8080 of every interface, which no flag changes:
one plane on the machine at a time may run it (the real node's, under its host-wide lock)."""
MPI_OPERATOR_NAMESPACE = "mpi-operator"
"""Where it holds its leader-election Lease (always on in v0.8.0)."""

ADMIN_USER = "admin"
NODE_CONTROLLERS = (
    "endpointslice-controller",
    "endpoints-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
)
"""What a plane with a real node runs besides: EndpointSlices (CoreDNS answers headless Services'
pods from them) and Endpoints (the API server's service proxy finds pods from them: KubeRay's
dashboard calls), the node lifecycle (takes off a new node's not-ready taint) and pod GC."""
OPERATOR_NAMESPACE = "kubeflow"
OPERATOR_SECRET = "training-operator-webhook-cert"
OPERATOR_WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
"""The name the Training Operator's cert rotator looks for (cmd/training-operator.v1)."""
OPERATOR_CA_NAME = "training-operator-ca"
"""The name the rotator verifies its CA for (pkg/cert)."""
ROTATOR_MOUNT_CHECK = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")
"""The rotator waits until this file exists (where a kubelet would mount the Secret; the path is
fixed in its code, whatever $TMPDIR says). Only its existence is checked: the webhook server
itself serves the files under the plane's own $TMPDIR."""


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # Creates keep the object as the client sent it (what was submitted, byte for byte).
        {
            "level": "Request",
            "verbs": ["create"],
            "resources": [
                {"group": "trainer.kubeflow.org"},
                {"group": "kubeflow.org"},
                {"group": "monitoring.coreos.com"},
                {"group": "", "resources": ["services"]},
            ],
        },
        {"level": "Metadata"},
    ],
}
"""Who called what (RBAC checks read it); the bodies of job and monitoring creates."""


def reference_missing() -> list[str]:
    """The reference files a full plane needs that are absent."""
    files = [
        path
        for group in ("jobset", "trainer", "pytorchjob", "tfjob", "xgboostjob", "mpijob", "kuberay")
        for path in CRD_FILES[group]
    ]
    files += [
        TRAINER / "torch_distributed_runtime.yaml",
        TRAINER / "webhook-configurations.yaml",
        JOBSET / "webhook-configurations.yaml",
        OPERATOR / "webhook-configurations.yaml",
        ENVTEST_CONFIG / "jobset-config.yaml",
        ENVTEST_CONFIG / "trainer-config.yaml",
    ]
    return [str(path) for path in files if not path.is_file()]


def _port_taken(port: int) -> bool:
    """Whether something listens on ``port`` of this machine (on any interface).

    SO_REUSEADDR, as the operator's own Go listener sets it: the connections of a plane that
    just stopped, left in TIME_WAIT for a minute, do not count (a second ``pytest -m node``
    right after the first found the port "taken" and failed its setup)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The documents of a YAML file, new objects on every call (callers change them).

    libyaml parses (the CRDs are megabytes: ten times faster than PyYAML's pure-Python loader),
    but PyYAML still builds the objects in Python: ~0.25 s per CRD file, paid at every plane
    start and CRD reinstall. So a file is read once per process and kept as JSON, which
    ``json.loads`` turns into fresh objects several times faster (keyed by the file's size and
    time, so an edited file is read again)."""
    stat = path.stat()
    return json.loads(_documents_json(path, stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _documents_json(path: Path, size: int, mtime_ns: int) -> str:
    text = path.read_text()
    return json.dumps([doc for doc in yaml.load_all(text, Loader=yaml.CSafeLoader) if doc])


@dataclass
class Ports:
    """Every port of one plane."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    jobset_webhook: int
    jobset_health: int
    trainer_webhook: int
    trainer_health: int
    operator_webhook: int
    operator_health: int
    operator_metrics: int
    kuberay_metrics: int
    kuberay_health: int
    mpi_operator_metrics: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*free_ports(len(cls.__dataclass_fields__)))


@dataclass
class ControlPlane:
    """One control plane: its folder, binaries and the parts it runs."""

    folder: Path
    binaries: Binaries
    parts: tuple[str, ...] = PARTS
    ports: Ports = field(default_factory=Ports.pick)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    components: list[Component] = field(default_factory=list)
    pytorch_init_template: Path | None = None
    """The Training Operator's --pytorch-init-container-template-file (an admin's setting)."""
    node_name: str | None = None
    """A real kubelet of this name joins (tests/cluster/node.py): the API server authorizes it as
    a node (Node,RBAC) with its token and reaches it with a client certificate; the
    controller-manager also runs what a node needs (EndpointSlices for DNS, node lifecycle for
    the not-ready taint, pod garbage collection)."""
    node_token: str = field(default_factory=lambda: secrets.token_hex(16))
    ca: certs.CertificateAuthority = field(default_factory=certs.CertificateAuthority)
    operator_ca: certs.CertificateAuthority = field(
        default_factory=lambda: certs.CertificateAuthority(OPERATOR_CA_NAME, rsa_key=True)
    )
    started_s: float = 0.0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: every request, by whom; creates with their bodies."""
        return self.folder / "audit.log"

    def audit_events(
        self,
        *,
        user: str | None = None,
        namespace: str | None = None,
        stage: str = "ResponseComplete",
    ) -> list[dict]:
        """The audit events of ``user`` in ``namespace`` at ``stage`` (a watch's
        ResponseComplete comes when it ends; its ResponseStarted, when it starts)."""
        events = []
        if not self.audit_log.is_file():
            return events
        for line in self.audit_log.read_text().splitlines():
            if (user is not None and user not in line) or (
                namespace is not None and namespace not in line
            ):
                continue  # cannot match (a user or namespace name has nothing JSON escapes)
            try:
                event = json.loads(line)
            except ValueError:
                continue  # the line the API server is writing now
            if event.get("stage") != stage:
                continue
            if user is not None and event.get("user", {}).get("username") != user:
                continue
            ref = event.get("objectRef") or {}
            if namespace is not None and ref.get("namespace") != namespace:
                continue
            events.append(event)
        return events

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's certificate (clients verify it)."""
        return self.folder / "apiserver-tls" / "ca.crt"

    def needs(self) -> tuple[str, ...]:
        """The binaries this plane runs."""
        names = list(CORE)
        if "controller-manager" in self.parts:
            names.append("kube-controller-manager")
        if "trainer" in self.parts:
            names += ["jobset-controller", "trainer-controller-manager"]
        if "training-operator" in self.parts:
            names.append("training-operator")
        if "kuberay" in self.parts:
            names.append("kuberay-operator")
        if "mpi-operator" in self.parts:
            names.append("mpi-operator")
        return tuple(name for name in names if name in (*CORE, *CONTROLLERS))

    # -- start / stop --------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        begin = time.monotonic()
        try:
            self._start_etcd()
            self._start_apiserver()
            self._install_crds()
            self._start_controllers()
            if "trainer" in self.parts:
                self.apply(load_documents(TRAINER / "torch_distributed_runtime.yaml"))
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - begin
        return self

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _component(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> Component:
        component = Component(name, argv, self.folder / "logs" / f"{name}.log", env or {})
        self.components.append(component.start())
        return component

    def _start_etcd(self) -> None:
        p = self.ports
        client, peer = f"http://127.0.0.1:{p.etcd_client}", f"http://127.0.0.1:{p.etcd_peer}"
        etcd = self._component(
            "etcd",
            [
                str(self.binaries["etcd"]),
                f"--data-dir={self.folder / 'etcd'}",
                "--name=default",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        etcd.wait_ready(f"{client}/health", timeout=30)

    def _start_apiserver(self) -> None:
        folder = self.folder
        private_key, public_key = certs.signing_key_pair(folder)
        self.service_account_key = private_key
        serving = self.ca.server("kube-apiserver", ("kubernetes", "kubernetes.default.svc"))
        serving.write(folder / "apiserver-tls", "apiserver.crt", "apiserver.key")
        self.ca.pem.write(folder / "apiserver-tls", "ca.crt", "ca.key")
        audit_policy = folder / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        tokens = folder / "tokens.csv"
        tokens.write_text(f'{self.admin_token},{ADMIN_USER},admin-uid,"system:masters"\n')
        node_flags: list[str] = []
        if self.node_name:
            with tokens.open("a") as out:
                out.write(
                    f'{self.node_token},system:node:{self.node_name},node-uid,"system:nodes"\n'
                )
            client = self.ca.client("kube-apiserver-kubelet-client", "system:masters")
            client.write(folder / "apiserver-tls", "kubelet-client.crt", "kubelet-client.key")
            node_flags = [
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={folder / 'apiserver-tls' / 'kubelet-client.crt'}",
                f"--kubelet-client-key={folder / 'apiserver-tls' / 'kubelet-client.key'}",
            ]
        apiserver = self._component(
            "kube-apiserver",
            [
                str(self.binaries["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                f"--tls-cert-file={folder / 'apiserver-tls' / 'apiserver.crt'}",
                f"--tls-private-key-file={folder / 'apiserver-tls' / 'apiserver.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={public_key}",
                f"--service-account-signing-key-file={private_key}",
                f"--token-auth-file={tokens}",
                *(node_flags or ["--authorization-mode=RBAC"]),
                "--service-cluster-ip-range=10.0.0.0/24",
                # No kubelet mints pod tokens here; Pod Security admission stays on (default).
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--kubelet-preferred-address-types=InternalIP",
                *(() if self.parts else ("--watch-cache=false",)),
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
            ],
        )
        apiserver.wait_ready(f"{self.url}/readyz", token=self.admin_token, timeout=60)

    def _start_controllers(self) -> None:
        started: list[tuple[Component, str]] = []
        if "controller-manager" in self.parts:
            started.append(self._start_controller_manager())
        if "trainer" in self.parts:
            started.append(self._start_jobset())
            started.append(self._start_trainer())
        if "training-operator" in self.parts:
            started.append(self._start_training_operator())
        if "kuberay" in self.parts:
            started.append(self._start_kuberay())
        if "mpi-operator" in self.parts:
            started.append(self._start_mpi_operator())
        # Registered before the controllers are ready: the Training Operator's cert rotator
        # waits until it finds its webhook configuration.
        self._register_webhooks()
        for component, url in started:
            component.wait_ready(url, timeout=90)

    def kubeconfig(self) -> Path:
        """A kubeconfig for the admin (the controllers use it)."""
        path = self.folder / "admin.kubeconfig"
        if not path.is_file():
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "envtest",
                        "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                    }
                ],
                "users": [{"name": ADMIN_USER, "user": {"token": self.admin_token}}],
                "contexts": [
                    {"name": "envtest", "context": {"cluster": "envtest", "user": ADMIN_USER}}
                ],
                "current-context": "envtest",
            }
            path.write_text(yaml.safe_dump(config))
        return path

    def _start_controller_manager(self) -> tuple[Component, str]:
        kubeconfig = str(self.kubeconfig())
        controllers = ",".join(
            [
                "job-controller",
                "garbage-collector-controller",
                "namespace-controller",
                "serviceaccount-controller",
                "serviceaccount-token-controller",
                "root-ca-certificate-publisher-controller",
                *(NODE_CONTROLLERS if self.node_name else ()),
            ]
        )
        port = self.ports.controller_manager
        component = self._component(
            "kube-controller-manager",
            [
                str(self.binaries["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--controllers={controllers}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.service_account_key}",
                f"--root-ca-file={self.ca_file}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.folder / 'kcm-certs'}",
                "--cluster-cidr=10.244.0.0/16",
                "--service-cluster-ip-range=10.0.0.0/24",
                # Garbage collection and Job syncs without the usual batching delays.
                "--concurrent-gc-syncs=5",
            ],
        )
        return component, f"https://127.0.0.1:{port}/healthz"

    def _start_jobset(self) -> tuple[Component, str]:
        cert_dir = self.folder / "jobset-certs"
        self.ca.server("jobset-webhook").write(cert_dir)
        config = yaml.safe_load((ENVTEST_CONFIG / "jobset-config.yaml").read_text())
        config["webhook"] = {
            "host": "127.0.0.1",
            "port": self.ports.jobset_webhook,
            "certDir": str(cert_dir),
        }
        config["health"] = {"healthProbeBindAddress": f"127.0.0.1:{self.ports.jobset_health}"}
        path = self.folder / "jobset-config.yaml"
        path.write_text(yaml.safe_dump(config))
        component = self._component(
            "jobset-controller",
            [
                str(self.binaries["jobset-controller"]),
                f"--kubeconfig={self.kubeconfig()}",
                f"--config={path}",
            ],
        )
        return component, f"http://127.0.0.1:{self.ports.jobset_health}/readyz"

    def _start_trainer(self) -> tuple[Component, str]:
        tmp = self.folder / "trainer-tmp"
        self.ca.server("trainer-webhook").write(tmp / "k8s-webhook-server" / "serving-certs")
        config = yaml.safe_load((ENVTEST_CONFIG / "trainer-config.yaml").read_text())
        config["webhook"] = {"port": self.ports.trainer_webhook, "host": "127.0.0.1"}
        config["health"] = {"healthProbeBindAddress": f"127.0.0.1:{self.ports.trainer_health}"}
        path = self.folder / "trainer-config.yaml"
        path.write_text(yaml.safe_dump(config))
        component = self._component(
            "trainer-controller-manager",
            [
                str(self.binaries["trainer-controller-manager"]),
                f"--kubeconfig={self.kubeconfig()}",
                f"--config={path}",
            ],
            env={"TMPDIR": str(tmp)},
        )
        return component, f"http://127.0.0.1:{self.ports.trainer_health}/readyz"

    def _start_training_operator(self) -> tuple[Component, str]:
        """The Training Operator waits for its cert rotator: give it the Secret it reads and the
        files its webhook server serves (under $TMPDIR, per plane)."""
        import base64

        tmp = self.folder / "operator-tmp"
        ca = self.operator_ca
        serving = ca.server("training-operator", (f"training-operator.{OPERATOR_NAMESPACE}.svc",))
        serving.write(tmp / "k8s-webhook-server" / "serving-certs")
        if not ROTATOR_MOUNT_CHECK.exists():
            serving.write(ROTATOR_MOUNT_CHECK.parent)
        self.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": OPERATOR_SECRET, "namespace": OPERATOR_NAMESPACE},
                    "data": {
                        name: base64.b64encode(value).decode()
                        for name, value in {
                            "ca.crt": ca.pem.cert,
                            "ca.key": ca.pem.key,
                            "tls.crt": serving.cert,
                            "tls.key": serving.key,
                        }.items()
                    },
                },
            ]
        )
        p = self.ports
        schemes = [f"--enable-scheme={s}" for s in OPERATOR_SCHEMES]
        component = self._component(
            "training-operator",
            [
                str(self.binaries["training-operator"]),
                f"--kubeconfig={self.kubeconfig()}",
                *schemes,
                f"--metrics-bind-address=127.0.0.1:{p.operator_metrics}",
                f"--health-probe-bind-address=127.0.0.1:{p.operator_health}",
                "--webhook-bind-host=127.0.0.1",
                f"--webhook-server-port={p.operator_webhook}",
                *(
                    [f"--pytorch-init-container-template-file={self.pytorch_init_template}"]
                    if self.pytorch_init_template
                    else []
                ),
            ],
            env={"TMPDIR": str(tmp)},
        )
        return component, f"http://127.0.0.1:{p.operator_health}/readyz"

    def _start_kuberay(self) -> tuple[Component, str]:
        """The KubeRay operator, as its README starts it here (webhooks off, no leader election:
        one per plane), asking the Ray head's dashboard for a RayJob's status through the API
        server's service proxy (``--use-kubernetes-proxy``, a KubeRay option): it runs on this
        machine, outside the pods' network and cluster DNS, as a plane's controllers do."""
        p = self.ports
        component = self._component(
            "kuberay-operator",
            [
                str(self.binaries["kuberay-operator"]),
                f"--kubeconfig={self.kubeconfig()}",
                f"--metrics-addr=127.0.0.1:{p.kuberay_metrics}",
                f"--health-probe-bind-address=127.0.0.1:{p.kuberay_health}",
                "--enable-leader-election=false",
                "--use-kubernetes-proxy",
                "--log-stdout-encoder=console",
            ],
        )
        return component, f"http://127.0.0.1:{p.kuberay_health}/readyz"

    def _start_mpi_operator(self) -> tuple[Component, str]:
        """The MPI Operator, as its README starts it here: its leader-election namespace first,
        its health port fixed (``MPI_OPERATOR_HEALTH``), its metrics on a port of this plane."""
        from kubernetes import client

        if _port_taken(MPI_OPERATOR_HEALTH):
            raise StartupError(
                f"the MPI Operator needs port {MPI_OPERATOR_HEALTH} (its /healthz, fixed in "
                "v0.8.0), which another process holds"
            )
        core = client.CoreV1Api(self.admin_client())
        core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=MPI_OPERATOR_NAMESPACE))
        )
        component = self._component(
            "mpi-operator",
            [
                str(self.binaries["mpi-operator"]),
                f"--kubeConfig={self.kubeconfig()}",
                f"--monitoring-port={self.ports.mpi_operator_metrics}",
                "-v=2",
            ],
        )
        return component, f"http://127.0.0.1:{MPI_OPERATOR_HEALTH}/healthz"

    # -- objects -------------------------------------------------------------------------------

    def admin_configuration(self) -> Any:
        """A ``kubernetes`` client Configuration for the admin (system:masters)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {self.admin_token}"}
        return configuration

    def admin_client(self) -> Any:
        """The admin's API client: the launcher's kind, which decodes pods without a
        ``Configuration`` per model (components/launcher/backends/kubernetes/clients.py)."""
        from components.launcher.backends.kubernetes.clients import model_api_client

        return model_api_client(self.admin_configuration())

    def apply(self, documents: list[dict[str, Any]]) -> None:
        """Create each document as admin (an object that exists is left as it is)."""
        from kubernetes.client.rest import ApiException
        from kubernetes.dynamic import DynamicClient

        # its discovery cache in the plane's folder (the default is a file in /tmp per URL,
        # which outlives the plane and would describe another plane on the same port later)
        client = DynamicClient(self.admin_client(), cache_file=str(self.folder / "discovery.json"))
        for document in documents:
            resource = client.resources.get(
                api_version=document["apiVersion"], kind=document["kind"]
            )
            namespace = document["metadata"].get("namespace")
            try:
                resource.create(body=document, namespace=namespace)
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def install_crds(self, groups: tuple[str, ...]) -> None:
        """Install the official CRDs of ``groups`` (see CRD_FILES) and wait until they serve."""
        from kubernetes import client

        api = client.ApiextensionsV1Api(self.admin_client())
        names = []
        for group in groups:
            for path in CRD_FILES[group]:
                for crd in load_documents(path):
                    names.append(crd["metadata"]["name"])
                    self._create_crd(crd)
        deadline = time.monotonic() + 30
        for name in names:
            while not _established(api.read_custom_resource_definition(name)):
                if time.monotonic() > deadline:
                    raise StartupError(f"CRD {name} was not Established within 30 s")
                time.sleep(0.1)

    def _create_crd(self, crd: dict[str, Any]) -> None:
        """Create ``crd``; one already there is fine."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.ApiextensionsV1Api(self.admin_client()).create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def delete_crds(self, groups: tuple[str, ...]) -> None:
        """Remove the CRDs of ``groups`` and wait until they are gone (a discovery test's setup)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = client.ApiextensionsV1Api(self.admin_client())
        names = [
            crd["metadata"]["name"]
            for g in groups
            for p in CRD_FILES[g]
            for crd in load_documents(p)
        ]
        for name in names:
            with contextlib.suppress(ApiException):
                api.delete_custom_resource_definition(name)
        deadline = time.monotonic() + 60
        for name in names:
            while True:
                try:
                    api.read_custom_resource_definition(name)
                except ApiException as exc:
                    if exc.status == 404:
                        break
                    raise
                if time.monotonic() > deadline:
                    raise StartupError(f"CRD {name} was not removed within 60 s")
                time.sleep(0.1)

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision: an older resourceVersion is gone (a watch from
        it answers 410 Gone where the API server watches etcd directly: the bare plane)."""
        base = f"http://127.0.0.1:{self.ports.etcd_client}/v3/kv"
        header = _post_json(f"{base}/range", {"key": "AA=="})["header"]
        revision = int(header["revision"])
        _post_json(f"{base}/compaction", {"revision": str(revision), "physical": True})
        return revision

    def serve_only(self, groups: tuple[str, ...]) -> None:
        """Serve the job CRDs of ``groups`` (of trainer, OPERATOR_SCHEMES, mpijob and kuberay)
        and no other."""
        jobs = ("trainer", *OPERATOR_SCHEMES, "mpijob", "kuberay")
        self.delete_crds(tuple(g for g in jobs if g not in groups))
        self.install_crds(groups)

    def _install_crds(self) -> None:
        groups = []
        if "trainer" in self.parts:
            groups += ["jobset", "trainer"]
        if "training-operator" in self.parts:
            groups += list(OPERATOR_SCHEMES)
        if "training-operator" in self.parts or "mpi-operator" in self.parts:
            groups.append("mpijob")
        if "kuberay" in self.parts:
            groups.append("kuberay")
            self._create_crd(RAYSERVICE_STAND_IN)
        if "monitoring" in self.parts:
            groups.append("monitoring")
        self.install_crds(tuple(groups))

    def _register_webhooks(self) -> None:
        """The official webhook configurations, pointed at the controllers on loopback."""
        documents = []
        if "trainer" in self.parts:
            documents += _webhooks(
                JOBSET, "jobset", self.ports.jobset_webhook, self.ca, pod_selector=True
            )
            documents += _webhooks(TRAINER, "trainer", self.ports.trainer_webhook, self.ca)
        if "training-operator" in self.parts:
            (validating,) = _webhooks(
                OPERATOR, "training-operator", self.ports.operator_webhook, self.operator_ca
            )
            validating["metadata"]["name"] = OPERATOR_WEBHOOK_CONFIGURATION
            documents.append(validating)
        self.apply(documents)
        self._wait_for_webhooks()

    def _wait_for_webhooks(self) -> None:
        """A dry-run create through each webhook answers (the API server's client is warm)."""
        # Webhook configurations take effect once the API server's informer sees them.
        time.sleep(0.5)


def _post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _established(crd: Any) -> bool:
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def _webhooks(
    folder: Path,
    prefix: str,
    port: int,
    ca: certs.CertificateAuthority,
    *,
    pod_selector: bool = False,
) -> list[dict[str, Any]]:
    """``folder``'s webhook configurations with ``url:`` clients on 127.0.0.1:``port``."""
    import base64

    bundle = base64.b64encode(ca.pem.cert).decode()
    out = []
    for document in load_documents(folder / "webhook-configurations.yaml"):
        document = copy.deepcopy(document)
        document["metadata"]["name"] = f"{prefix}-{document['metadata']['name']}"
        for webhook in document["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            pods = any("pods" in rule.get("resources", []) for rule in webhook.get("rules", []))
            if pod_selector and pods:
                # Only JobSet's own pods: a cluster's other pods never go through this webhook.
                webhook["objectSelector"] = {
                    "matchExpressions": [
                        {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}
                    ]
                }
        out.append(document)
    return out
