"""``TrainSpec``: everything a training-job launch needs, in one validated, keyword-only dataclass.

One spec for every cluster API: ``api`` picks the Kubeflow Trainer v2 ``TrainJob``, the Training
Operator v1 ``PyTorchJob``, or ``auto`` (whichever of those two the cluster serves, decided at
submit time); ``tfjob`` (the Training Operator v1 ``TFJob``, for TensorFlow programs) is only
ever chosen explicitly and runs your image and command, never our PyTorch trainer.
The CLI (its flags are derived from these fields), the KFP component, both backends and the tests
all build this same object. Values are checked on construction; an error names the field, the
value and what is allowed, and a field the chosen API cannot express is refused with the
alternative, never silently dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import secrets
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from components import DEFAULT_IMAGE
from components.launcher import monitoring
from components.launcher.names import (
    DNS1035,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    ISTIO_INJECT,
    KUEUE_QUEUE_LABEL,
    LABEL_VALUE,
    default_namespace,
    derive_job_name,
    qualified_name_ok,
    run_labels,
)

APIS = ("auto", "trainjob", "pytorchjob", "tfjob")
"""``auto``: TrainJob when the cluster serves Kubeflow Trainer v2, else PyTorchJob (never TFJob)."""
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
NCCL_PRESETS: dict[str, dict[str, str]] = {
    # Plain TCP sockets (clouds without RDMA): no InfiniBand; NCCL and gloo pinned to the pod's
    # interface (network_interface), not "anything but lo/docker", which picks up CNI bridges.
    "tcp": {
        "NCCL_DEBUG": "WARN",
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "{interface}",
        "GLOO_SOCKET_IFNAME": "{interface}",
    },
    # RDMA fabrics: InfiniBand on, GPUDirect RDMA up to the PCIe host bridge, more queue pairs;
    # bootstrap over the pod's interface. The pod also gets IPC_LOCK (pinned memory for RDMA)
    # and, with rdma_resource, the RDMA device from the device plugin.
    "infiniband": {
        "NCCL_DEBUG": "WARN",
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "{interface}",
        "GLOO_SOCKET_IFNAME": "{interface}",
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
SHM_PER_PROCESS_GI = 2
"""``shm_size="auto"``: GiB of /dev/shm per process (its DataLoader workers' batches)."""
RESTART_POLICIES = ("OnFailure", "ExitCode", "Never", "Always")
CLEAN_POD_POLICIES = ("Running", "All", "None")
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CHOICES: dict[str, tuple[str, ...]] = {
    "api": APIS,
    "runtime_kind": RUNTIME_KINDS,
    "nccl_preset": tuple(NCCL_PRESETS),
    "restart_policy": RESTART_POLICIES,
    "clean_pod_policy": CLEAN_POD_POLICIES,
    "metrics_monitor": monitoring.MONITORS,
}
"""Fields whose value must be one of a fixed set (the CLI shows them as choices)."""
DEFAULT_COMMAND = ("python", "-m", "trainer.torchrun", "-m", "trainer.train")
STAGE_ROOT = "/stage"
"""Where a node stages its data (stage_data_uri) on its own disk."""
STAGED_DATA = f"{STAGE_ROOT}/current"
"""The staged data set as the trainer sees it (a symlink to the frozen folder)."""
NODE_OUTPUT = f"{STAGE_ROOT}/output"
"""A node's own output folder (same disk as its staged data) when no volume is shared: the
trainer mirrors its checkpoints and model to S3 (--checkpoint-uri) from there."""

_GANG = (
    "gang scheduling is a runtime setting in Kubeflow Trainer v2 (the runtime's podGroupPolicy, "
    "e.g. `podGroupPolicy: {volcano: {}}` as in Trainer's Volcano example): create such a "
    "ClusterTrainingRuntime and set runtime_name to it, or queue with Kueue (kueue_queue)"
)
_ELASTIC = (
    "elastic training (elasticPolicy) was removed in Kubeflow Trainer v2.2: use a fixed number "
    "of workers, or api=pytorchjob on a cluster with the Training Operator v1"
)
_RESTARTS = (
    "a TrainJob restarts per its runtime's JobSet failurePolicy (maxRestarts), which a TrainJob "
    "cannot patch: set it in your runtime (runtime_name), or use api=pytorchjob"
)
_PS = "parameter servers are a TensorFlow concept: use api=tfjob for a TensorFlow program"
_TF_RUNTIME = (
    "runtimes are a Kubeflow Trainer v2 concept, and Trainer v2 has no TensorFlow runtime; a TFJob "
    "runs on the Training Operator v1"
)
_TF_ELASTIC = (
    "elastic training is torchrun's (a PyTorchJob's elasticPolicy); a TFJob has a fixed number "
    "of workers: set workers, and let a restarted replica resume from its checkpoint (Keras "
    "BackupAndRestore or tf.train.CheckpointManager)"
)
UNSUPPORTED: dict[str, dict[str, str]] = {
    "trainjob": {
        "elastic_min_replicas": _ELASTIC,
        "elastic_max_replicas": _ELASTIC,
        "max_restarts": _ELASTIC,
        "scheduler_name": _GANG,
        "min_available": _GANG,
        "queue": _GANG,
        "priority_class": (
            "a TrainJob has no priority class and runtimePatches cannot set priorityClassName: "
            "set it in your runtime's pod template (runtime_name), or use a Kueue "
            "WorkloadPriorityClass (labels kueue.x-k8s.io/priority-class=NAME)"
        ),
        "host_network": (
            "runtimePatches cannot set hostNetwork/dnsPolicy: set `hostNetwork: true` and "
            "`dnsPolicy: ClusterFirstWithHostNet` in your runtime's pod template and set "
            "runtime_name to it"
        ),
        "restart_policy": _RESTARTS,
        "backoff_limit": _RESTARTS,
        "clean_pod_policy": (
            "a TrainJob's pods belong to its JobSet and go with it; the launcher's cleanup "
            "option decides when the job is deleted"
        ),
        "ttl_seconds_after_finished": (
            "a TrainJob has no ttlSecondsAfterFinished (it is the runtime's JobSet setting); the "
            "launcher's cleanup option decides when the job is deleted"
        ),
        "ps_replicas": _PS,
    },
    "pytorchjob": {
        "runtime_name": "runtimes are a Kubeflow Trainer v2 concept; use api=trainjob",
        "runtime_kind": "runtimes are a Kubeflow Trainer v2 concept; use api=trainjob",
        "ps_replicas": _PS,
    },
    "tfjob": {
        "runtime_name": _TF_RUNTIME,
        "runtime_kind": _TF_RUNTIME,
        "elastic_min_replicas": _TF_ELASTIC,
        "elastic_max_replicas": _TF_ELASTIC,
        "max_restarts": _TF_ELASTIC,
    },
}
"""API → field → why that API cannot express the field, and the alternative."""


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

    @classmethod
    def coerce(cls, value: Any) -> PvcMount:
        """A PvcMount from itself, ``"CLAIM:PATH[:ro]"``, a dict or ``(claim, path[, ro])``."""
        if isinstance(value, PvcMount):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            return cls(**value)
        if isinstance(value, tuple | list) and len(value) in (2, 3):
            return cls(claim=value[0], path=value[1], read_only=bool(value[2:3] and value[2]))
        raise SpecError(
            f"pvcs: {value!r} is not a PvcMount, 'CLAIM:PATH[:ro]' or (claim, path[, ro])"
        )


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


def _flag(name: str) -> dict[str, str]:
    return {"flag": name}


@dataclass(kw_only=True)
class TrainSpec:
    """A distributed training job: ``workers`` nodes, each running the trainer (or your image)."""

    api: str = "auto"
    """Cluster API: trainjob (Kubeflow Trainer v2), pytorchjob (Training Operator v1) or auto
    (trainjob when the cluster serves trainer.kubeflow.org/v1alpha1, else pytorchjob)."""
    name: str = ""
    """Job name (DNS-1035). Empty: derived from run_id + task_name (a retried step re-attaches)."""
    namespace: str = ""
    """Namespace. Empty: the pod's own namespace in a cluster, else default."""
    image: str = DEFAULT_IMAGE
    """Container image of every node."""
    command: list[str] | None = None
    """Container command as a JSON list. None: the trainer through torchrun, wrapped so that a
    SIGTERM stays a retryable exit status (python -m trainer.torchrun -m trainer.train)."""
    args: list[str] = field(default_factory=list)
    """Arguments appended to the command (the trainer's flags for the default command)."""
    workers: int = 1
    """Number of nodes (pods): a TrainJob's numNodes; a PyTorchJob's Master + workers-1 Workers;
    a TFJob's Chief + workers-1 Workers."""
    ps_replicas: int = 0
    """TFJob parameter-server (PS) pods, besides the workers (other APIs: 0)."""
    nproc_per_node: int | None = None
    """Processes per node; torchrun starts them (None: one per GPU, gpus_per_worker, or 1; a
    TFJob: 1)."""
    gpus_per_worker: int = 0
    """GPUs per node, requested as gpu_resource limits."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource name of the GPUs."""
    cpu_request: str | None = field(default=None, metadata=_flag("--cpu"))
    """CPU request per node (Kubernetes quantity, e.g. 4 or 500m)."""
    cpu_limit: str | None = None
    """CPU limit per node."""
    memory_request: str | None = field(default=None, metadata=_flag("--memory"))
    """Memory request per node (e.g. 16Gi)."""
    memory_limit: str | None = None
    """Memory limit per node."""
    rdma_resource: str | None = None
    """Extended resource of the RDMA device (e.g. rdma/rdma_shared_device_a), 1 per node, with
    nccl_preset=infiniband (from your RDMA device plugin)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables KEY=VALUE (win over the NCCL preset)."""
    nccl_preset: str | None = None
    """NCCL settings preset: tcp, infiniband or debug (None: NCCL's own defaults)."""
    network_interface: str = "eth0"
    """The pods' network interface the tcp/infiniband presets pin NCCL and gloo to."""
    shm_size: str | None = "auto"
    """Size of the memory-backed /dev/shm: auto (2Gi per process, at most half the memory
    limit), a quantity, or '' / None for the runtime's 64Mi."""
    pvcs: list[PvcMount] = field(default_factory=list, metadata=_flag("--pvc"))
    """PVC mounts CLAIM:PATH[:ro]."""
    stage_data_uri: str | None = None
    """s3://bucket/prefix every node stages onto its own disk before training (no shared volume
    needed); the trainer reads it at /stage/current."""
    stage_data_digest: str | None = None
    """The listing digest the pipeline checked: a node that finds other data in S3 fails (exit 2:
    permanent) instead of training on data nobody checked."""
    stage_cache_host_path: str | None = None
    """A hostPath folder that keeps staged data on the node between pods (a restarted pod on the
    same node transfers nothing); None: an emptyDir, staged anew by every pod."""
    s3_endpoint: str | None = None
    """S3 endpoint the nodes use (AWS_ENDPOINT_URL_S3); None: AWS or the image's settings."""
    s3_credentials_secret: str | None = None
    """Secret whose AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY the nodes get as environment
    variables (data staging, the checkpoint mirror); never values in the manifest."""
    host_network: bool = False
    """Use the node's network (RDMA/perf); sets dnsPolicy ClusterFirstWithHostNet (PyTorchJob)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Pod nodeSelector KEY=VALUE."""
    tolerations: list[dict[str, Any]] = field(default_factory=list, metadata=_flag("--toleration"))
    """Pod tolerations KEY[=VALUE][:EFFECT] (dicts with key, operator, value, effect,
    toleration_seconds from Python)."""
    service_account: str | None = None
    """Service account of the pods."""
    image_pull_secrets: list[str] = field(
        default_factory=list, metadata=_flag("--image-pull-secret")
    )
    """Names of image pull Secrets."""
    runtime_name: str | None = None
    """TrainJob runtimeRef name (None: the ClusterTrainingRuntime torch-distributed)."""
    runtime_kind: str | None = None
    """TrainJob runtimeRef kind: ClusterTrainingRuntime or TrainingRuntime (None: the former)."""
    scheduler_name: str | None = None
    """PyTorchJob/TFJob pod schedulerName (e.g. volcano); turns on gang scheduling
    (schedulingPolicy)."""
    min_available: int | None = None
    """PyTorchJob/TFJob gang size: pods schedulable together. None with a scheduler: all pods."""
    queue: str | None = None
    """PyTorchJob/TFJob runPolicy.schedulingPolicy.queue (e.g. the Volcano queue)."""
    priority_class: str | None = None
    """PyTorchJob/TFJob runPolicy.schedulingPolicy.priorityClass."""
    kueue_queue: str | None = None
    """Kueue LocalQueue name, set as the kueue.x-k8s.io/queue-name label."""
    elastic_min_replicas: int | None = field(default=None, metadata=_flag("--elastic-min"))
    """PyTorchJob elastic training: lower bound of pods (set with elastic_max_replicas)."""
    elastic_max_replicas: int | None = field(default=None, metadata=_flag("--elastic-max"))
    """PyTorchJob elastic training: upper bound of pods."""
    max_restarts: int | None = None
    """PyTorchJob elastic training: torchrun's --max-restarts (elastic only)."""
    restart_policy: str | None = None
    """PyTorchJob/TFJob replica restart policy: OnFailure, ExitCode, Never or Always (None:
    OnFailure)."""
    backoff_limit: int | None = None
    """PyTorchJob/TFJob restarts before the job is marked Failed (None: 3)."""
    active_deadline_seconds: int | None = None
    """Job wall-clock limit in seconds."""
    clean_pod_policy: str | None = None
    """PyTorchJob/TFJob pods deleted when the job finishes: Running, All or None (None: Running, so
    finished pods stay for their logs)."""
    ttl_seconds_after_finished: int | None = None
    """PyTorchJob/TFJob: the operator deletes the finished job after this many seconds."""
    termination_grace_period_seconds: int | None = 120
    """Time the trainer gets to checkpoint after SIGTERM (eviction, cancel)."""
    labels: dict[str, str] = field(default_factory=dict, metadata=_flag("--label"))
    """Extra labels KEY=VALUE on the job and its pods."""
    annotations: dict[str, str] = field(
        default_factory=lambda: {ISTIO_INJECT: "false"}, metadata=_flag("--annotation")
    )
    """Annotations KEY=VALUE on the job and its pods (added to the default, which keeps Istio
    sidecars out: they never exit)."""
    metrics_port: int = 0
    """Prometheus metrics of every trainer process (local rank k on PORT + k): the ports opened on
    every pod, --metrics-port for our trainer, scrape annotations, a PodMonitor and a
    PrometheusRule (hang and throughput alerts) beside the job; 0: off (see monitoring.py)."""
    metrics_monitor: str = "podmonitor"
    """How the Prometheus Operator finds the pods: podmonitor, or servicemonitor (a headless
    Service + ServiceMonitor)."""
    hang_alert_s: int = 900
    """The hang alert fires when a rank completed no step for this many seconds."""
    run_id: str = ""
    """KFP run id: the run-id label, and with task_name the default name."""
    task_name: str = "train"
    """KFP task name: the task label, and part of the default name."""

    def __post_init__(self) -> None:
        self._normalise()
        self._check()

    # -- derived values ------------------------------------------------------------------------

    @property
    def elastic(self) -> bool:
        """Whether the job uses the v1 operator's elastic policy (torchrun c10d rendezvous)."""
        return self.elastic_min_replicas is not None or self.elastic_max_replicas is not None

    @property
    def pod_count(self) -> int:
        """Pods the job runs: the workers (nodes) and any parameter servers."""
        return self.workers + self.ps_replicas

    @property
    def world_size(self) -> int:
        """Total number of trainer processes."""
        return self.workers * self.nproc_per_node

    def for_api(self, api: str) -> TrainSpec:
        """This spec bound to ``api`` (re-validated: a field that API cannot express fails)."""
        return dataclasses.replace(self, api=api)

    def container_command(self) -> list[str]:
        """The container command (the default runs the trainer through torchrun)."""
        return list(self.command) if self.command is not None else list(DEFAULT_COMMAND)

    def container_args(self) -> list[str]:
        """The container's arguments: ``args``, plus ``--device cuda`` for our trainer on GPUs.

        With GPUs requested the trainer must never fall back to the CPU quietly (it would hold
        the GPUs and train at a crawl), so it is told to use CUDA or fail.
        """
        args = list(self.args)
        ours = self.command is None
        if ours and self.gpus_per_worker and self.trainer_flag("--device") is None:
            args += ["--device", "cuda"]
        return args + monitoring.trainer_flags(self)

    def merged_env(self) -> dict[str, str]:
        """NCCL preset (with the network interface) then ``env`` (user values win)."""
        preset = NCCL_PRESETS.get(self.nccl_preset or "", {})
        filled = {k: v.replace("{interface}", self.network_interface) for k, v in preset.items()}
        return filled | dict(self.env)

    @property
    def rdma(self) -> bool:
        """Whether the pods need what RDMA needs (IPC_LOCK, the RDMA device)."""
        return self.nccl_preset == "infiniband"

    def warnings(self) -> list[str]:
        """Settings that are valid but likely wasteful or incomplete (logged, not refused)."""
        found = []
        if self.gpus_per_worker and self.nproc_per_node < self.gpus_per_worker:
            idle = self.gpus_per_worker - self.nproc_per_node
            found.append(
                f"nproc_per_node={self.nproc_per_node} < gpus_per_worker={self.gpus_per_worker}: "
                f"{idle} GPU(s) per node stay idle; leave nproc_per_node unset for one process "
                "per GPU"
            )
        if self.rdma and not self.rdma_resource:
            found.append(
                "nccl_preset=infiniband without rdma_resource: the pods get IPC_LOCK but no RDMA "
                "device; set rdma_resource to your device plugin's resource (e.g. "
                "rdma/rdma_shared_device_a), or use host_network with a privileged runtime"
            )
        return found

    def stage_command(self) -> list[str]:
        """The command that stages ``stage_data_uri`` on the node (empty without staging)."""
        if not self.stage_data_uri:
            return []
        return [
            "python",
            "-m",
            "components.s3_sync.stage",
            "--source",
            self.stage_data_uri,
            "--root",
            STAGE_ROOT,
            "--link",
            STAGED_DATA,
            *(["--expect-digest", self.stage_data_digest] if self.stage_data_digest else []),
        ]

    def job_labels(self) -> dict[str, str]:
        """Labels on the job and its pods: user labels, run id, task, Kueue queue."""
        labels = dict(self.labels) | run_labels(self.run_id, self.task_name)
        if self.kueue_queue:
            labels[KUEUE_QUEUE_LABEL] = self.kueue_queue
        return labels

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

    # -- normalisation -------------------------------------------------------------------------

    def _normalise(self) -> None:
        if not self.namespace:
            self.namespace = default_namespace()
        if not self.name:
            self.name = (
                derive_job_name(self.run_id, self.task_name)
                if self.run_id
                else f"train-{secrets.token_hex(4)}"
            )
        if isinstance(self.args, str):
            self.args = [self.args]
        if isinstance(self.command, str):
            raise SpecError(
                f"command={self.command!r} must be a list of strings, e.g. ['python', 'train.py']"
            )
        if self.nproc_per_node is None:
            gpus = self.gpus_per_worker
            per_gpu = isinstance(gpus, int) and gpus > 0 and self.api != "tfjob"
            self.nproc_per_node = gpus if per_gpu else 1
        if self.shm_size == "auto":
            self.shm_size = self._auto_shm()
        self.pvcs = [PvcMount.coerce(p) for p in self.pvcs]
        self.tolerations = [
            parse_toleration(t) if isinstance(t, str) else t for t in self.tolerations
        ]
        self.args = [str(a) for a in self.args]
        if self.shm_size == "":
            self.shm_size = None
        for attr in ("env", "annotations", "labels", "node_selector"):
            setattr(self, attr, {str(k): str(v) for k, v in getattr(self, attr).items()})

    def _auto_shm(self) -> str:
        """2Gi of /dev/shm per process, at most half the memory limit (it counts against it)."""
        from kubernetes.utils import parse_quantity

        nproc = self.nproc_per_node if isinstance(self.nproc_per_node, int) else 1
        size = SHM_PER_PROCESS_GI * max(nproc, 1) * 2**30
        if isinstance(self.memory_limit, str):
            with contextlib.suppress(ValueError):  # a bad limit is reported by its own check
                size = min(size, int(parse_quantity(self.memory_limit)) // 2)
        return f"{size // 2**20}Mi" if size % 2**30 else f"{size // 2**30}Gi"

    # -- validation ----------------------------------------------------------------------------

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

    def _check(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value is not None and value not in allowed:
                self._fail(name, f"allowed: {', '.join(allowed)}")
        self._check_identity()
        self._check_sizes()
        self._check_env_and_metadata()
        self._check_volumes()
        self._check_scheduling()
        self._check_policies()
        self._check_api_support()
        for name, why in monitoring.spec_problems(self):
            self._fail(name, why)

    def _check_identity(self) -> None:
        if not isinstance(self.name, str) or len(self.name) > 63 or not DNS1035.match(self.name):
            self._fail(
                "name",
                "must be a DNS-1035 label: lower-case letters, digits and '-', starting with a "
                "letter, ending with a letter or digit, at most 63 characters (e.g. resnet-ddp-1)",
            )
        self._check_pod_names()
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

    def _check_pod_names(self) -> None:
        """The controllers name pods/hostnames after the job; those must stay <= 63 too."""
        last = max(int(self.workers) - 1, 0) if isinstance(self.workers, int) else 0
        if self.api == "tfjob":  # <job>-chief-0, <job>-worker-<workers-2>, <job>-ps-<ps-1>
            ps = self.ps_replicas if isinstance(self.ps_replicas, int) else 0
            suffixes = ["chief-0"]
            if last:
                suffixes.append(f"worker-{last - 1}")
            if ps:
                suffixes.append(f"ps-{ps - 1}")
            longest = max((f"{self.name}-{suffix}" for suffix in suffixes), key=len)
        elif self.api == "pytorchjob":
            replica = "worker" if self.workers > 1 or self.elastic else "master"
            longest = f"{self.name}-{replica}-{last}"
        else:  # a TrainJob's JobSet hostname <job>-node-<index>-0 (auto may become either)
            longest = max(f"{self.name}-node-{last}-0", f"{self.name}-worker-{last}", key=len)
        if len(longest) > 63:
            self._fail(
                "name",
                f"too long for its pod hostnames ({longest!r} has {len(longest)} > 63 "
                f"characters); use at most {63 - (len(longest) - len(self.name))} characters",
            )

    def _check_sizes(self) -> None:
        self._int("workers", minimum=1, maximum=10_000)
        self._int("ps_replicas", minimum=0, maximum=10_000)
        self._int("nproc_per_node", minimum=1, maximum=1024)
        self._int("gpus_per_worker", minimum=0, maximum=1024)
        if self.gpus_per_worker and self.nproc_per_node > self.gpus_per_worker:
            self._fail(
                "nproc_per_node",
                f"{self.nproc_per_node} processes per node but only gpus_per_worker="
                f"{self.gpus_per_worker} GPUs; use nproc_per_node <= gpus_per_worker",
            )
        for name in ("gpu_resource", "rdma_resource"):
            value = getattr(self, name)
            if value is not None and (
                "/" not in value or not DNS1123_SUBDOMAIN.match(value.split("/")[0])
            ):
                self._fail(name, "must be an extended resource name like nvidia.com/gpu")
        if self.rdma_resource and not self.rdma:
            self._fail("rdma_resource", "is requested only with nccl_preset=infiniband")
        if not ENV_NAME.match(self.network_interface or "") or "/" in self.network_interface:
            self._fail("network_interface", "must be an interface name such as eth0 or ens5")
        self._check_quantities()

    def _quantity(self, name: str):
        """The field's value as a number (None when unset); refuses what is no quantity."""
        from kubernetes.utils import parse_quantity

        value = getattr(self, name)
        if value is None:
            return None
        try:
            parsed = parse_quantity(value) if isinstance(value, str) else None
        except ValueError:
            parsed = None
        if parsed is None or value.startswith("-"):
            self._fail(name, "must be a Kubernetes quantity such as 500m, 4, 16Gi or 1.5")
        return parsed

    def _check_quantities(self) -> None:
        sizes = {
            name: self._quantity(name)
            for name in ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "shm_size")
        }
        for req, lim in (("cpu_request", "cpu_limit"), ("memory_request", "memory_limit")):
            if sizes[req] is not None and sizes[lim] is not None and sizes[req] > sizes[lim]:
                self._fail(req, f"must not exceed {lim}={getattr(self, lim)!r}")
        shm, memory = sizes["shm_size"], sizes["memory_limit"]
        if shm is not None and shm <= 0:
            self._fail("shm_size", "must be positive, or None for the container runtime's 64Mi")
        if shm is not None and memory is not None and shm >= memory:
            self._fail(
                "shm_size",
                f"/dev/shm is memory and counts against memory_limit={self.memory_limit!r}; "
                "use a smaller shm_size or a larger memory_limit",
            )

    def _check_env_and_metadata(self) -> None:
        for key in self.env:
            if not ENV_NAME.match(key):
                self._fail("env", f"{key!r} is not a valid environment variable name")
        for attr in ("labels", "annotations", "node_selector"):
            for key, value in getattr(self, attr).items():
                if not qualified_name_ok(key):
                    self._fail(attr, f"key {key!r} is not a valid label/annotation key")
                if attr != "annotations" and (len(value) > 63 or not LABEL_VALUE.match(value)):
                    self._fail(attr, f"value {value!r} of {key!r} is not a valid label value")
        for attr in ("run_id", "task_name"):
            if not isinstance(getattr(self, attr), str):
                self._fail(attr, "must be a string")

    def _check_staging(self) -> None:
        uri = self.stage_data_uri
        if uri is not None and (not isinstance(uri, str) or not uri.startswith("s3://")):
            self._fail("stage_data_uri", "must be an s3://bucket/prefix URI")
        host = self.stage_cache_host_path
        if host is not None and (not host.startswith("/") or host.rstrip("/") == ""):
            self._fail("stage_cache_host_path", "must be an absolute folder such as /mnt/cache")
        if host is not None and uri is None:
            self._fail("stage_cache_host_path", "caches staged data: set stage_data_uri too")
        digest = self.stage_data_digest
        if digest is not None and (uri is None or not re.fullmatch(r"[0-9a-f]{8,64}", digest)):
            self._fail(
                "stage_data_digest",
                "must be the hex listing digest of stage_data_uri (the pipeline's data step "
                "outputs it); leave it unset to train on whatever the nodes find",
            )
        secret = self.s3_credentials_secret
        if secret is not None and (len(secret) > 253 or not DNS1123_SUBDOMAIN.match(secret)):
            self._fail("s3_credentials_secret", "must be a Secret name such as s3-credentials")
        endpoint = self.s3_endpoint
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            self._fail("s3_endpoint", "must be a URL such as https://minio.example.com")

    def _check_volumes(self) -> None:
        self._check_staging()
        seen: set[str] = {STAGE_ROOT} if self.stage_data_uri else set()
        for p in self.pvcs:
            if len(p.claim) > 253 or not DNS1123_SUBDOMAIN.match(p.claim):
                self._fail("pvcs", f"claim {p.claim!r} is not a valid PVC name")
            if not p.path.startswith("/") or p.path in seen or p.path == "/dev/shm":
                self._fail(
                    "pvcs",
                    f"mount path {p.path!r} must be absolute, unique, not /dev/shm and not "
                    f"{STAGE_ROOT} with stage_data_uri",
                )
            seen.add(p.path)

    def _check_scheduling(self) -> None:
        for name in (
            "service_account",
            "scheduler_name",
            "priority_class",
            "runtime_name",
        ):
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
        if self.min_available is not None and self.min_available > self.pod_count:
            self._fail("min_available", f"must be <= the job's pods ({self.pod_count})")
        for i, toleration in enumerate(self.tolerations):
            problem = _toleration_problem(toleration)
            if problem:
                self._fail("tolerations", f"item {i}: {problem}")

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
        self._int("backoff_limit", minimum=0, optional=True)
        self._int("active_deadline_seconds", minimum=1, optional=True, maximum=2**63 - 1)
        self._int("ttl_seconds_after_finished", minimum=0, optional=True)
        self._int("termination_grace_period_seconds", minimum=0, optional=True)
        if not isinstance(self.host_network, bool):
            self._fail("host_network", "must be true or false")

    def _check_api_support(self) -> None:
        """Refuse what the chosen API cannot express, naming the alternative."""
        for name, why in UNSUPPORTED.get(self.api, {}).items():
            if getattr(self, name) not in (None, False):
                self._fail(name, f"api={self.api} cannot express it: {why}")
        if self.api == "trainjob":
            reserved = sorted(k for k in self.env if k.startswith("PET_"))
            if reserved:
                self._fail(
                    "env",
                    f"{reserved} are set by the Trainer controller (it rejects TrainJobs that "
                    "set PET_* names); leave them out",
                )
        if self.api == "tfjob":
            self._check_tensorflow_program()

    def _check_tensorflow_program(self) -> None:
        """A TFJob runs the user's TensorFlow program: their image and command, one per pod."""
        if self.image == DEFAULT_IMAGE:
            self._fail(
                "image",
                "api=tfjob runs your TensorFlow program, and this default image holds our PyTorch "
                "trainer without TensorFlow: set image to one with TensorFlow and your code",
            )
        if self.command is None:
            self._fail(
                "command",
                "api=tfjob needs your program's command, e.g. ['python', '/app/train.py'] (the "
                "default command runs our PyTorch trainer, which is no TensorFlow program)",
            )
        if self.nproc_per_node != 1:
            self._fail(
                "nproc_per_node",
                "a TFJob runs one TensorFlow process per pod (MultiWorkerMirroredStrategy uses "
                "every GPU of its pod): keep nproc_per_node=1 and set gpus_per_worker",
            )
        if "TF_CONFIG" in self.env:
            self._fail(
                "env",
                "TF_CONFIG is set by the Training Operator for each replica (cluster and task); "
                "leave it out",
            )


def _toleration_problem(toleration: Any) -> str:
    """What is wrong with one toleration dict ('' when nothing)."""
    if not isinstance(toleration, dict):
        return "must be a dict with key/operator/value/effect"
    allowed = {"key", "operator", "value", "effect", "toleration_seconds"}
    if set(toleration) - allowed:
        return f"unknown keys {sorted(set(toleration) - allowed)}"
    operator = toleration.get("operator", "Equal")
    if operator not in TOLERATION_OPERATORS:
        return f"operator {operator!r} not in {TOLERATION_OPERATORS}"
    if operator == "Exists" and toleration.get("value"):
        return "operator Exists takes no value"
    effect = toleration.get("effect")
    if effect is not None and effect not in TOLERATION_EFFECTS:
        return f"effect {effect!r} not in {TOLERATION_EFFECTS}"
    if toleration.get("toleration_seconds") is not None and effect != "NoExecute":
        return "toleration_seconds needs effect NoExecute"
    return ""
