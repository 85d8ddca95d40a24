"""``TrainSpec``: everything a PyTorchJob launch needs, in one validated, keyword-only dataclass.

The CLI, the KFP component, both backends and the tests all build this same object. Values are
checked on construction; an error names the field, the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from components import DEFAULT_IMAGE

RUN_ID_LABEL = "kfp-ddp.io/run-id"
"""Label on every PyTorchJob: the KFP run id (cleanup and re-attach select on it)."""
TASK_LABEL = "kfp-ddp.io/task"
"""Label on every PyTorchJob: the KFP task name that launched it."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ISTIO_INJECT = "sidecar.istio.io/inject"

NCCL_PRESETS: dict[str, dict[str, str]] = {
    # Plain TCP sockets (clouds without RDMA): no InfiniBand, skip loopback/docker bridges.
    "tcp": {
        "NCCL_DEBUG": "WARN",
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
    },
    # RDMA fabrics: InfiniBand on, GPUDirect RDMA up to the PCIe host bridge, more queue pairs.
    "infiniband": {
        "NCCL_DEBUG": "WARN",
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_IB_QPS_PER_CONNECTION": "4",
    },
    # Hangs at init: log NCCL's topology and network choices, and torch's collective checks.
    "debug": {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    },
}
RESTART_POLICIES = ("OnFailure", "ExitCode", "Never", "Always")
CLEAN_POD_POLICIES = ("Running", "All", "None")
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
SERVICE_ACCOUNT_NS_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class SpecError(ValueError):
    """A TrainSpec value is invalid; the message names the field, the value and the fix."""


@dataclass(frozen=True, kw_only=True)
class PvcMount:
    """One PersistentVolumeClaim mounted into every replica."""

    claim: str
    """Name of an existing PersistentVolumeClaim in the job's namespace."""
    path: str
    """Absolute mount path inside the container, e.g. ``/workspace``."""
    read_only: bool = False
    """Mount read-only."""

    @classmethod
    def parse(cls, text: str) -> PvcMount:
        """Parse ``CLAIM:PATH[:ro]`` (the CLI form)."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise SpecError(f"pvcs: {text!r} is not CLAIM:PATH[:ro], e.g. workspace:/workspace:ro")
        return cls(claim=parts[0], path=parts[1], read_only=len(parts) == 3 and parts[2] == "ro")


def parse_toleration(text: str) -> dict[str, Any]:
    """``key[=value][:Effect]`` → a toleration dict (no ``=value``: operator Exists)."""
    body, _, effect = text.partition(":")
    key, sep, value = body.partition("=")
    tol: dict[str, Any] = {"key": key or None, "operator": "Equal" if sep else "Exists"}
    if sep:
        tol["value"] = value
    if effect:
        tol["effect"] = effect
    return tol


def default_namespace() -> str:
    """The pod's own namespace when running in a cluster, else ``default``."""
    try:
        return SERVICE_ACCOUNT_NS_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def derive_job_name(run_id: str, task_name: str) -> str:
    """A DNS-1035 job name that is the same every time the same KFP run + task asks for one.

    A retried step therefore finds (and re-attaches to) the job its first attempt created, and a
    recurring run gets a fresh name each time, unlike a name fixed at compile time.
    """
    base = re.sub(r"[^a-z0-9-]+", "-", task_name.lower()).strip("-")[:24].strip("-")
    if not base or not base[0].isalpha():
        base = f"ptj-{base}".rstrip("-")
    digest = hashlib.sha256(f"{run_id}/{task_name}".encode()).hexdigest()[:10]
    return f"{base}-{digest}"


def label_safe(value: str) -> str:
    """``value`` if it is a valid label value, else a stable 63-character-or-less digest of it."""
    if len(value) <= 63 and LABEL_VALUE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def _qualified_name_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))


@dataclass(kw_only=True)
class TrainSpec:
    """A distributed training job: one Master + ``workers - 1`` Workers running the trainer."""

    name: str = ""
    """PyTorchJob name (DNS-1035). Empty: derived from ``run_id`` + ``task_name``."""
    namespace: str = ""
    """Namespace. Empty: the pod's own namespace in a cluster, else ``default``."""
    image: str = DEFAULT_IMAGE
    """Container image of every replica."""
    command: list[str] | None = None
    """Container command. None: the trainer through torchrun, wrapped so that a SIGTERM stays a
    retryable exit status (``python -m trainer.torchrun -m trainer.train``; plain torchrun exits 1,
    which the operator's ExitCode policy reads as permanent)."""
    args: list[str] = field(default_factory=list)
    """Arguments appended to the command (the trainer's flags for the default command)."""
    workers: int = 1
    """Number of pods (nodes): 1 Master + ``workers - 1`` Workers (all Workers when elastic)."""
    nproc_per_node: int = 1
    """Processes per pod (usually = GPUs per pod); torchrun starts them."""
    gpus_per_worker: int = 0
    """GPUs per pod, requested as ``gpu_resource`` limits."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource name of the GPUs."""
    cpu_request: str | None = None
    """CPU request per pod (Kubernetes quantity, e.g. ``4`` or ``500m``)."""
    cpu_limit: str | None = None
    """CPU limit per pod."""
    memory_request: str | None = None
    """Memory request per pod (e.g. ``16Gi``)."""
    memory_limit: str | None = None
    """Memory limit per pod."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables (win over the NCCL preset)."""
    nccl_preset: str | None = None
    """NCCL settings preset: tcp | infiniband | debug (None: NCCL's own defaults)."""
    shm_size: str | None = "2Gi"
    """Size of the memory-backed ``/dev/shm`` (DataLoader workers need more than 64 MiB)."""
    pvcs: list[PvcMount] = field(default_factory=list)
    """PVC mounts (``PvcMount`` or ``"CLAIM:PATH[:ro]"`` strings)."""
    host_network: bool = False
    """Use the node's network (RDMA/perf); sets dnsPolicy ClusterFirstWithHostNet."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Pod nodeSelector."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """Pod tolerations: dicts with key, operator, value, effect, toleration_seconds."""
    service_account: str | None = None
    """Service account of the pods."""
    image_pull_secrets: list[str] = field(default_factory=list)
    """Names of image pull Secrets."""
    scheduler_name: str | None = None
    """Pod schedulerName (e.g. ``volcano``); turns on gang scheduling (schedulingPolicy)."""
    min_available: int | None = None
    """Gang size: pods that must be schedulable together. None with a scheduler: ``workers``."""
    queue: str | None = None
    """runPolicy.schedulingPolicy.queue (e.g. the Volcano queue)."""
    priority_class: str | None = None
    """runPolicy.schedulingPolicy.priorityClass."""
    kueue_queue: str | None = None
    """Kueue LocalQueue name, set as the ``kueue.x-k8s.io/queue-name`` label."""
    elastic_min_replicas: int | None = None
    """Elastic training: lower bound of pods (set with ``elastic_max_replicas``)."""
    elastic_max_replicas: int | None = None
    """Elastic training: upper bound of pods."""
    max_restarts: int | None = None
    """Elastic training: torchrun's --max-restarts (elastic only)."""
    restart_policy: str = "OnFailure"
    """Replica restart policy: OnFailure | ExitCode | Never | Always."""
    backoff_limit: int | None = 3
    """Restarts before the job is marked Failed (None: the operator's default)."""
    active_deadline_seconds: int | None = None
    """Job wall-clock limit in seconds."""
    clean_pod_policy: str = "Running"
    """Pods deleted when the job finishes: Running (keep finished pods for logs) | All | None."""
    ttl_seconds_after_finished: int | None = None
    """Delete the finished job after this many seconds (operator side)."""
    termination_grace_period_seconds: int | None = 120
    """Time the trainer gets to checkpoint after SIGTERM (eviction, cancel)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels on the job and its pods."""
    annotations: dict[str, str] = field(default_factory=lambda: {ISTIO_INJECT: "false"})
    """Annotations on the job and its pods. Default keeps Istio sidecars out (they never exit)."""
    run_id: str = ""
    """KFP run id: the run-id label, and with ``task_name`` the default name."""
    task_name: str = "train"
    """KFP task name: the task label, and part of the default name."""

    def __post_init__(self) -> None:
        self._normalise()
        self._check()

    # -- helpers -------------------------------------------------------------------------------

    @property
    def elastic(self) -> bool:
        """Whether the job uses the operator's elastic policy (torchrun c10d rendezvous)."""
        return self.elastic_min_replicas is not None or self.elastic_max_replicas is not None

    @property
    def world_size(self) -> int:
        """Total number of trainer processes."""
        return self.workers * self.nproc_per_node

    def replica_counts(self) -> dict[str, int]:
        """Replica type → replicas as the manifest will have them."""
        if self.elastic:
            return {"Worker": self.workers}
        return {"Master": 1} | ({"Worker": self.workers - 1} if self.workers > 1 else {})

    def container_command(self) -> list[str]:
        """The container command (the default runs the trainer through torchrun)."""
        if self.command is not None:
            return list(self.command)
        return ["python", "-m", "trainer.torchrun", "-m", "trainer.train"]

    def merged_env(self) -> dict[str, str]:
        """NCCL preset then ``env`` (user values win)."""
        return dict(NCCL_PRESETS.get(self.nccl_preset or "", {})) | dict(self.env)

    def trainer_flag(self, flag: str) -> str | None:
        """Value of ``--flag V`` / ``--flag=V`` in ``args`` (e.g. ``--output-dir``), or None."""
        for i, arg in enumerate(self.args):
            if arg == flag and i + 1 < len(self.args):
                return self.args[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (JSON-serialisable)."""
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of all fields (for overrides)."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_overrides(cls, base: dict[str, Any], overrides: dict[str, Any]) -> TrainSpec:
        """``TrainSpec(**base | overrides)``, refusing unknown override keys with the valid ones."""
        unknown = sorted(set(overrides) - set(cls.field_names()))
        if unknown:
            raise SpecError(
                f"overrides: unknown field(s) {unknown}; valid: {', '.join(cls.field_names())}"
            )
        return cls(**(base | overrides))

    # -- normalisation + validation ------------------------------------------------------------

    def _normalise(self) -> None:
        if not self.namespace:
            self.namespace = default_namespace()
        if not self.name:
            self.name = (
                derive_job_name(self.run_id, self.task_name)
                if self.run_id
                else f"pytorchjob-{secrets.token_hex(4)}"
            )
        if isinstance(self.args, tuple | str):
            self.args = [self.args] if isinstance(self.args, str) else list(self.args)
        if isinstance(self.command, str):
            raise SpecError(
                f"command={self.command!r} must be a list of strings, e.g. ['python', 'train.py']"
            )
        pvcs = []
        for p in self.pvcs:
            if isinstance(p, str):
                p = PvcMount.parse(p)
            elif isinstance(p, dict):
                p = PvcMount(**p)
            elif isinstance(p, tuple | list) and len(p) in (2, 3):
                p = PvcMount(claim=p[0], path=p[1], read_only=bool(p[2]) if len(p) == 3 else False)
            if not isinstance(p, PvcMount):
                raise SpecError(
                    f"pvcs: {p!r} is not a PvcMount, 'CLAIM:PATH[:ro]' or (claim, path[, ro])"
                )
            pvcs.append(p)
        self.pvcs = pvcs
        self.tolerations = [
            parse_toleration(t) if isinstance(t, str) else t for t in self.tolerations
        ]
        self.args = [str(a) for a in self.args]
        self.env = {str(k): str(v) for k, v in self.env.items()}
        self.annotations = {str(k): str(v) for k, v in self.annotations.items()}
        self.labels = {str(k): str(v) for k, v in self.labels.items()}

    def _fail(self, name: str, why: str) -> None:
        raise SpecError(f"TrainSpec.{name}={getattr(self, name)!r} is invalid: {why}")

    def _int(self, name: str, *, minimum: int, optional: bool = False, maximum: int = 2**31 - 1):
        value = getattr(self, name)
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(name, f"must be an integer >= {minimum}")
        if not minimum <= value <= maximum:
            self._fail(name, f"must be between {minimum} and {maximum}")

    def _quantity(self, name: str) -> None:
        value = getattr(self, name)
        if value is None:
            return
        if not isinstance(value, str) or not QUANTITY.match(value) or value.startswith("-"):
            self._fail(name, "must be a Kubernetes quantity such as 500m, 4, 16Gi or 1.5")

    def _check(self) -> None:
        self._check_identity()
        self._check_sizes()
        self._check_env_and_metadata()
        self._check_volumes()
        self._check_scheduling()
        self._check_policies()

    def _check_identity(self) -> None:
        if not isinstance(self.name, str) or len(self.name) > 63 or not DNS1035.match(self.name):
            self._fail(
                "name",
                "must be a DNS-1035 label: lower-case letters, digits and '-', starting with a "
                "letter, ending with a letter or digit, at most 63 characters (e.g. resnet-ddp-1)",
            )
        # The operator names pods and Services <name>-worker-<i>; those must stay <= 63 too.
        longest = f"{self.name}-{'worker' if self.workers > 1 or self.elastic else 'master'}-"
        longest += str(max(int(self.workers) - 1, 0)) if isinstance(self.workers, int) else "0"
        if len(longest) > 63:
            self._fail(
                "name",
                f"too long for its pod/Service names ({longest!r} has {len(longest)} > 63 "
                f"characters); use at most {63 - (len(longest) - len(self.name))} characters",
            )
        if len(self.namespace) > 63 or not DNS1123_LABEL.match(self.namespace):
            self._fail("namespace", "must be a DNS-1123 label such as kubeflow-user")
        if (
            not isinstance(self.image, str)
            or not self.image
            or any(c.isspace() for c in self.image)
        ):
            self._fail("image", f"must be a container image reference, e.g. {DEFAULT_IMAGE}")
        if self.command is not None and (
            not isinstance(self.command, list)
            or not self.command
            or not all(isinstance(c, str) and c for c in self.command)
        ):
            self._fail("command", "must be None (the trainer) or a non-empty list of strings")

    def _check_sizes(self) -> None:
        self._int("workers", minimum=1, maximum=10_000)
        self._int("nproc_per_node", minimum=1, maximum=1024)
        self._int("gpus_per_worker", minimum=0, maximum=1024)
        if self.gpus_per_worker and self.nproc_per_node > self.gpus_per_worker:
            self._fail(
                "nproc_per_node",
                f"{self.nproc_per_node} processes per pod but only gpus_per_worker="
                f"{self.gpus_per_worker} GPUs; use nproc_per_node <= gpus_per_worker",
            )
        if not DNS1123_SUBDOMAIN.match(self.gpu_resource.split("/")[0]) or "/" not in (
            self.gpu_resource
        ):
            self._fail("gpu_resource", "must be an extended resource name like nvidia.com/gpu")
        for name in ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "shm_size"):
            self._quantity(name)
        from kubernetes.utils import parse_quantity

        for req, lim in (("cpu_request", "cpu_limit"), ("memory_request", "memory_limit")):
            r, li = getattr(self, req), getattr(self, lim)
            if r is not None and li is not None and parse_quantity(r) > parse_quantity(li):
                self._fail(req, f"must not exceed {lim}={li!r}")
        if self.shm_size is not None and parse_quantity(self.shm_size) <= 0:
            self._fail("shm_size", "must be positive, or None for the container runtime's 64Mi")
        if (
            self.shm_size
            and self.memory_limit
            and parse_quantity(self.shm_size) >= parse_quantity(self.memory_limit)
        ):
            self._fail(
                "shm_size",
                f"/dev/shm is memory and counts against memory_limit={self.memory_limit!r}; "
                "use a smaller shm_size or a larger memory_limit",
            )

    def _check_env_and_metadata(self) -> None:
        for key in self.env:
            if not ENV_NAME.match(key):
                self._fail("env", f"{key!r} is not a valid environment variable name")
        if self.nccl_preset is not None and self.nccl_preset not in NCCL_PRESETS:
            self._fail("nccl_preset", f"allowed: {', '.join(NCCL_PRESETS)} or None")
        for attr in ("labels", "annotations", "node_selector"):
            for key, value in getattr(self, attr).items():
                if not _qualified_name_ok(key):
                    self._fail(attr, f"key {key!r} is not a valid label/annotation key")
                if attr != "annotations" and (len(value) > 63 or not LABEL_VALUE.match(value)):
                    self._fail(attr, f"value {value!r} of {key!r} is not a valid label value")
        for attr in ("run_id", "task_name"):
            if not isinstance(getattr(self, attr), str):
                self._fail(attr, "must be a string")

    def _check_volumes(self) -> None:
        seen: set[str] = set()
        for p in self.pvcs:
            if len(p.claim) > 253 or not DNS1123_SUBDOMAIN.match(p.claim):
                self._fail("pvcs", f"claim {p.claim!r} is not a valid PVC name")
            if not p.path.startswith("/") or p.path in seen or p.path == "/dev/shm":
                self._fail(
                    "pvcs", f"mount path {p.path!r} must be absolute, unique and not /dev/shm"
                )
            seen.add(p.path)

    def _check_scheduling(self) -> None:
        for name in ("service_account", "scheduler_name", "priority_class"):
            value = getattr(self, name)
            if value is not None and (len(value) > 253 or not DNS1123_SUBDOMAIN.match(value)):
                self._fail(name, "must be a DNS-1123 name such as volcano or high-priority")
        for name in ("queue", "kueue_queue"):
            value = getattr(self, name)
            if value is not None and (len(value) > 63 or not DNS1123_LABEL.match(value)):
                self._fail(name, "must be a DNS-1123 label such as team-a")
        for secret in self.image_pull_secrets:
            if not DNS1123_SUBDOMAIN.match(secret):
                self._fail("image_pull_secrets", f"{secret!r} is not a valid Secret name")
        self._int("min_available", minimum=1, optional=True)
        if self.min_available is not None and self.min_available > self.workers:
            self._fail("min_available", f"must be <= workers={self.workers}")
        for i, tol in enumerate(self.tolerations):
            if not isinstance(tol, dict):
                self._fail("tolerations", f"item {i} must be a dict with key/operator/value/effect")
            allowed = {"key", "operator", "value", "effect", "toleration_seconds"}
            if set(tol) - allowed:
                self._fail("tolerations", f"item {i}: unknown keys {sorted(set(tol) - allowed)}")
            op = tol.get("operator", "Equal")
            if op not in TOLERATION_OPERATORS:
                self._fail(
                    "tolerations", f"item {i}: operator {op!r} not in {TOLERATION_OPERATORS}"
                )
            if op == "Exists" and tol.get("value"):
                self._fail("tolerations", f"item {i}: operator Exists takes no value")
            effect = tol.get("effect")
            if effect is not None and effect not in TOLERATION_EFFECTS:
                self._fail(
                    "tolerations", f"item {i}: effect {effect!r} not in {TOLERATION_EFFECTS}"
                )
            if tol.get("toleration_seconds") is not None and effect != "NoExecute":
                self._fail("tolerations", f"item {i}: toleration_seconds needs effect NoExecute")

    def _check_policies(self) -> None:
        if self.elastic:
            lo, hi = self.elastic_min_replicas, self.elastic_max_replicas
            if lo is None or hi is None:
                self._fail(
                    "elastic_min_replicas",
                    "elastic training needs both elastic_min_replicas and elastic_max_replicas",
                )
            self._int("elastic_min_replicas", minimum=1)
            self._int("elastic_max_replicas", minimum=1)
            if not lo <= self.workers <= hi:
                self._fail(
                    "workers",
                    f"must lie within elastic_min_replicas={lo} .. elastic_max_replicas={hi}",
                )
        elif self.max_restarts is not None:
            self._fail(
                "max_restarts",
                "is torchrun's elastic --max-restarts; set elastic_min_replicas and "
                "elastic_max_replicas too, or use backoff_limit for non-elastic jobs",
            )
        self._int("max_restarts", minimum=0, optional=True)
        if self.restart_policy not in RESTART_POLICIES:
            self._fail("restart_policy", f"allowed: {', '.join(RESTART_POLICIES)}")
        if self.clean_pod_policy not in CLEAN_POD_POLICIES:
            self._fail("clean_pod_policy", f"allowed: {', '.join(CLEAN_POD_POLICIES)}")
        self._int("backoff_limit", minimum=0, optional=True)
        self._int("active_deadline_seconds", minimum=1, optional=True, maximum=2**63 - 1)
        self._int("ttl_seconds_after_finished", minimum=0, optional=True)
        self._int("termination_grace_period_seconds", minimum=0, optional=True)
        if not isinstance(self.host_network, bool):
            self._fail("host_network", "must be true or false")
