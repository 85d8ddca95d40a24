"""``TrainSpec``: everything a training-job launch needs, in one validated, keyword-only dataclass.

One spec for every cluster API: ``api`` picks the Kubeflow Trainer v2 ``TrainJob``, the Training
Operator v1 ``PyTorchJob``, or ``auto`` (whichever of those two the cluster serves, decided at
submit time); ``tfjob`` and ``xgboostjob`` (the Training Operator v1 ``TFJob`` and
``XGBoostJob``, for TensorFlow and XGBoost programs) are only ever chosen explicitly and run your
image and command, never our PyTorch trainer; ``rayjob`` (a KubeRay ``RayJob``, also only ever
chosen explicitly) runs our trainer under Ray Train, or your Ray program; ``mpijob`` (an MPI
Operator ``MPIJob``, likewise) runs our trainer under mpirun, or your MPI program.
The CLI (its flags are derived from these fields), the KFP component, both backends and the tests
all build this same object. Values are checked on construction; an error names the field, the
value and what is allowed, and a field the chosen API cannot express is refused with the
alternative, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import difflib
import secrets
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from components import DEFAULT_IMAGE
from components.launcher import monitoring, sizing, spec_rules
from components.launcher.api_options import (
    OPTIONS_OF_API,
    SETTINGS_OF_APIS,
    ApiOptions,
    MPIJobOptions,
    OperatorOptions,
    PyTorchJobOptions,
    RayJobOptions,
    TFJobOptions,
    TrainJobOptions,
    XGBoostJobOptions,
    bind,
    options_from_settings,
)
from components.launcher.names import (
    ISTIO_INJECT,
    KUEUE_QUEUE_LABEL,
    default_namespace,
    derive_job_name,
    run_labels,
)
from components.launcher.pod_extras import PodExtras
from components.launcher.pod_paths import IMAGE_HOME, SCRATCH_DIRS, SCRATCH_ENV
from components.launcher.sizing import SHM_PER_PROCESS_GI
from components.launcher.spec_rules import (
    APIS,
    CHOICES,
    CLEAN_POD_POLICIES,
    NCCL_PRESETS,
    NODE_ACCESS_FIELDS,
    NODE_OUTPUT,
    RESTART_POLICIES,
    RUNTIME_KINDS,
    STAGE_CACHE,
    STAGE_CACHE_KEEP,
    STAGE_ROOT,
    STAGE_SYNC_CACHE,
    STAGED_DATA,
    TOLERATION_EFFECTS,
    TOLERATION_OPERATORS,
    SpecError,
)

__all__ = [  # the spec's vocabulary lives in spec_rules; importers find it here too
    "APIS",
    "CHOICES",
    "CLEAN_POD_POLICIES",
    "DEFAULT_COMMAND",
    "IMAGE_HOME",
    "NCCL_PRESETS",
    "NODE_ACCESS_FIELDS",
    "NODE_OUTPUT",
    "PodExtras",
    "PvcMount",
    "RESTART_POLICIES",
    "RUNTIME_KINDS",
    "SCRATCH_DIRS",
    "SCRATCH_ENV",
    "SHM_PER_PROCESS_GI",
    "STAGE_CACHE",
    "STAGED_DATA",
    "STAGE_ROOT",
    "STAGE_SYNC_CACHE",
    "SpecError",
    "TOLERATION_EFFECTS",
    "TOLERATION_OPERATORS",
    "TrainSpec",
    "parse_toleration",
]


DEFAULT_COMMAND = ("python", "-m", "trainer.torchrun", "-m", "trainer.train")
MPI_TRAINER = ("python", "-m", "trainer.mpirun")
"""What starts our trainer on an MPI runtime's launcher: mpirun, on every slot of the hostfile."""
MPI_FIRST_ON_EACH_NODE = "--first-on-each-node"
"""``trainer.mpirun``'s flag for a command line run once on every host before the program."""


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
    (trainjob when the cluster serves trainer.kubeflow.org/v1alpha1, else pytorchjob); tfjob and
    xgboostjob (Training Operator v1) for TensorFlow and XGBoost programs; rayjob (KubeRay) for
    our trainer under Ray Train or your Ray program; mpijob (MPI Operator) for our trainer under
    mpirun or your MPI program."""
    api_options: ApiOptions | None = None
    """What only the API says (``TrainJobOptions``, ``PyTorchJobOptions``, ``TFJobOptions``,
    ``XGBoostJobOptions``, ``MPIJobOptions``, ``RayJobOptions``; see api_options.py). None: the
    API's defaults (with auto: whichever API the cluster serves)."""
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
    a TFJob's Chief + workers-1 Workers; an XGBoostJob's Master + workers-1 Workers."""
    nproc_per_node: int | None = None
    """Processes per node; torchrun starts them (None: one per GPU, gpus_per_worker, or 1; a
    TFJob or an XGBoost job: 1)."""
    gpus_per_worker: int = 0
    """GPUs per node, requested as gpu_resource limits."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource name of the GPUs."""
    cpu_request: str | None = field(default=None, metadata={"old_flag": "--cpu"})
    """CPU request per node (Kubernetes quantity, e.g. 4 or 500m). None: 4 per GPU (1 per process
    without GPUs), so that a pod is never BestEffort; with cpu_limit alone, the limit."""
    cpu_limit: str | None = None
    """CPU limit per node (qos=guaranteed: the request)."""
    memory_request: str | None = field(default=None, metadata={"old_flag": "--memory"})
    """Memory request per node (e.g. 16Gi). None: 16Gi per GPU (4Gi per process without GPUs);
    with memory_limit alone, the limit."""
    memory_limit: str | None = None
    """Memory limit per node (qos=guaranteed: the request)."""
    qos: str = "burstable"
    """burstable (requests, limits only where given) or guaranteed (CPU, memory and disk limits
    equal to the requests: the pods are the last evicted)."""
    ephemeral_storage: str | None = None
    """Node-local disk per pod: its ephemeral-storage request and limit. None: the staging
    volume (see stage_data_bytes) plus 4Gi: the /tmp (1Gi) and HOME (2Gi) emptyDirs and 1Gi of
    logs (the containers' root file systems are read-only)."""
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
    same node transfers nothing; older data sets are evicted); None: an emptyDir, staged anew by
    every pod. A node path: an admin setting, never a pipeline parameter; hostPath volumes need
    pod_security=privileged (baseline and restricted refuse them); system folders are refused."""
    stage_data_bytes: int | None = None
    """Size of the data set in bytes (the pipeline's data step counts it): sizes the staging
    volume, 1.1 x this (rounded up to GiB) + checkpoint_space. None: 100Gi + checkpoint_space."""
    checkpoint_space: str = "20Gi"
    """Room on a node's staging volume for its checkpoints and outputs (object-store storage:
    they are written there, then mirrored to S3)."""
    s3_endpoint: str | None = None
    """S3 endpoint the nodes use (AWS_ENDPOINT_URL_S3); None: AWS or the image's settings."""
    s3_credentials_secret: str | None = None
    """Secret whose AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY the nodes get as environment
    variables (data staging, the checkpoint mirror); never values in the manifest."""
    pod_security: str = "restricted"
    """The Pod Security Standard the pods are built to pass (the namespace's enforce level, or
    stricter): restricted (non-root run_as_user, no privilege escalation, every capability
    dropped, RuntimeDefault seccomp), baseline (no privilege escalation, RuntimeDefault seccomp;
    the image may run as root), or privileged (nothing imposed; needed for capabilities,
    host_network and stage_cache_host_path)."""
    run_as_user: int | None = 1000
    """UID of every container (the image's kfp-ddp user); None: the image's USER (restricted
    still needs it to be non-root)."""
    run_as_group: int | None = 1000
    """GID of every container and the pods' fsGroup (volumes writable by it); None: the image's."""
    capabilities: list[str] = field(default_factory=list, metadata=_flag("--capability"))
    """Linux capabilities added to the training container: only IPC_LOCK (pinned memory for RDMA
    with nccl_preset=infiniband), which needs pod_security=privileged — neither baseline nor
    restricted allows it."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Pod nodeSelector KEY=VALUE."""
    tolerations: list[dict[str, Any]] = field(default_factory=list, metadata=_flag("--toleration"))
    """Pod tolerations KEY[=VALUE][:EFFECT] (dicts with key, operator, value, effect,
    toleration_seconds from Python)."""
    pod_extras: PodExtras | None = None
    """Pod settings as Kubernetes JSON (JSON object of affinity, env with valueFrom, volumes,
    volume_mounts): what a KFP task forwards beyond the fields above (see pod_extras.py)."""
    service_account: str | None = None
    """Service account of the pods."""
    image_pull_secrets: list[str] = field(
        default_factory=list, metadata=_flag("--image-pull-secret")
    )
    """Names of image pull Secrets."""
    kueue_queue: str | None = None
    """Kueue LocalQueue name, set as the kueue.x-k8s.io/queue-name label."""
    active_deadline_seconds: int | None = None
    """Job wall-clock limit in seconds."""
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
        self._bind_options()
        self._normalise()
        spec_rules.check(self)

    @classmethod
    def flat(cls, **settings: Any) -> TrainSpec:
        """A spec from its flat form, every setting at the top level (the CLI's flags, the
        training step's overrides): the API's own settings go into ``api_options`` for ``api``
        (see ``api_options.options_from_settings``; one the API lacks is refused)."""
        own = {name: settings.pop(name) for name in list(settings) if name in SETTINGS_OF_APIS}
        if own:
            if settings.get("api_options") is not None:
                raise SpecError(
                    f"give {sorted(own)} inside api_options, or api_options not at all",
                    field=sorted(own)[0],
                )
            api = settings.get("api", "auto")
            if api in APIS:  # a bad api is refused by name when the spec is built
                settings["api_options"] = options_from_settings(api, own)
        return cls(**settings)

    # -- derived values ------------------------------------------------------------------------

    @property
    def pytorchjob(self) -> PyTorchJobOptions | None:
        """The PyTorchJob options, when the spec has them."""
        return self.api_options if isinstance(self.api_options, PyTorchJobOptions) else None

    @property
    def ray(self) -> RayJobOptions:
        """The RayJob options (the defaults for a spec of another API)."""
        if isinstance(self.api_options, RayJobOptions):
            return self.api_options
        return RayJobOptions()

    @property
    def mpi(self) -> MPIJobOptions:
        """The MPIJob options (the defaults for a spec of another API)."""
        if isinstance(self.api_options, MPIJobOptions):
            return self.api_options
        return MPIJobOptions()

    @property
    def operator(self) -> OperatorOptions:
        """The Training Operator v1 options of a PyTorchJob or TFJob spec (the defaults when a
        spec of another API is asked)."""
        if isinstance(self.api_options, OperatorOptions):
            return self.api_options
        return OperatorOptions()

    @property
    def runtime(self) -> TrainJobOptions:
        """The TrainJob options (the defaults for a spec of another API)."""
        if isinstance(self.api_options, TrainJobOptions):
            return self.api_options
        return TrainJobOptions()

    @property
    def framework(self) -> str:
        """What the job's program is written with: ``tensorflow`` (a TFJob), ``xgboost`` (an
        XGBoostJob, a TrainJob on an XGBoost runtime), else ``pytorch`` (our trainer, or yours)."""
        if self.api == "tfjob":
            return "tensorflow"
        # api=auto with TrainJob options (a runtime_name) can only become a TrainJob.
        if self.api == "xgboostjob" or (
            self.api in ("trainjob", "auto") and self.runtime.is_xgboost
        ):
            return "xgboost"
        return "pytorch"

    @property
    def one_process_per_pod(self) -> bool:
        """The program runs once per pod whatever its GPUs: a TensorFlow program's (one process
        drives every GPU of its pod), an XGBoost program's."""
        return self.framework != "pytorch"

    @property
    def ps_replicas(self) -> int:
        """A TFJob's parameter servers (0 for the other APIs)."""
        return self.api_options.ps_replicas if isinstance(self.api_options, TFJobOptions) else 0

    @property
    def elastic(self) -> bool:
        """Whether the job uses the v1 operator's elastic policy (torchrun c10d rendezvous)."""
        return bool(self.pytorchjob and self.pytorchjob.elastic)

    @property
    def workers_only(self) -> bool:
        """A PyTorchJob of Workers only (no Master): elastic, or meeting by c10d rendezvous."""
        options = self.pytorchjob
        return self.elastic or (
            self.api == "pytorchjob" and not (options and options.pytorch_master)
        )

    @property
    def pod_count(self) -> int:
        """Pods the job runs: the workers (nodes) and any parameter servers."""
        return self.workers + self.ps_replicas

    @property
    def extras(self) -> PodExtras:
        """``pod_extras``, coerced when the spec is built (empty when not given)."""
        return self.pod_extras or PodExtras()

    @property
    def world_size(self) -> int:
        """Total number of trainer processes."""
        return self.workers * (self.nproc_per_node or 1)  # resolved when the spec is built

    def for_api(self, api: str) -> TrainSpec:
        """This spec bound to ``api`` (re-validated: an option that API lacks is refused)."""
        if api not in OPTIONS_OF_API:
            concrete = ", ".join(OPTIONS_OF_API)
            raise SpecError(f"api={api!r} is not a concrete API; use one of {concrete}")
        return dataclasses.replace(self, api=api, api_options=bind(self.api_options, api))

    def container_command(self) -> list[str]:
        """The container command (the default runs the trainer through torchrun; on an MPI
        runtime through ``trainer.mpirun``, from the launcher pod)."""
        if self.command is not None:
            return list(self.command)
        if self.mpi_trainer:
            return [*MPI_TRAINER, "-m", "trainer.train"]
        return list(DEFAULT_COMMAND)

    @property
    def mpi_trainer(self) -> bool:
        """Whether our trainer runs under mpirun (an MPIJob, or a TrainJob on an MPI runtime):
        started from the launcher pod over SSH on node pods that run sshd in this spec's
        image."""
        if self.command is not None:
            return False
        return self.api == "mpijob" or (self.api == "trainjob" and self.runtime.is_mpi)

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
        """Whether the pods use RDMA (the infiniband preset): the RDMA device, usually IPC_LOCK."""
        return self.nccl_preset == "infiniband"

    def stage_volume_size(self) -> str | None:
        """The staging volume's sizeLimit (None without staging): see ``sizing``."""
        if not self.stage_data_uri:
            return None
        if self.stage_cache_host_path:  # the data lives in the cache: checkpoints and outputs
            return sizing.stage_volume_size(0, self.checkpoint_space)
        return sizing.stage_volume_size(self.stage_data_bytes, self.checkpoint_space)

    def disk(self) -> str:
        """The pod's ephemeral-storage request (and limit): given, or the staging volume + 4Gi."""
        return self.ephemeral_storage or sizing.ephemeral_storage(self.stage_volume_size())

    def warnings(self) -> list[str]:
        """Settings that are valid but likely wasteful or incomplete (logged, not refused)."""
        found = []
        nproc = self.nproc_per_node or 1  # resolved when the spec is built
        if self.gpus_per_worker and nproc < self.gpus_per_worker:
            idle = self.gpus_per_worker - nproc
            found.append(
                f"nproc_per_node={self.nproc_per_node} < gpus_per_worker={self.gpus_per_worker}: "
                f"{idle} GPU(s) per node stay idle; leave nproc_per_node unset for one process "
                "per GPU"
            )
        if self.rdma and not self.rdma_resource:
            found.append(
                "nccl_preset=infiniband without rdma_resource: the pods get no RDMA device; set "
                "rdma_resource to your device plugin's resource (e.g. rdma/rdma_shared_device_a), "
                "or use host_network with a privileged runtime"
            )
        if self.rdma and "IPC_LOCK" not in self.capabilities:
            found.append(
                "nccl_preset=infiniband without capabilities=['IPC_LOCK']: registering memory with "
                "the HCA fails unless the container runtime or the RDMA device plugin raises the "
                "memlock limit; IPC_LOCK needs pod_security=privileged and a namespace enforcing "
                "privileged"
            )
        master = self.pytorchjob is not None and self.pytorchjob.pytorch_master
        if self.api == "pytorchjob" and master and self.pod_security == "restricted":
            found.append(
                "pytorch_master=True: the Training Operator v1.9 gives every Worker an "
                "init-pytorch container without a securityContext, which restricted Pod Security "
                "refuses, unless the operator runs with --pytorch-init-container-template-file "
                "(README: PyTorchJob and Pod Security); the default (Workers only) needs nothing"
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
            STAGE_CACHE if self.stage_cache_host_path else STAGE_ROOT,
            "--link",
            STAGED_DATA,
            *(["--expect-digest", self.stage_data_digest] if self.stage_data_digest else []),
            *(["--keep-snapshots", str(STAGE_CACHE_KEEP)] if self.stage_cache_host_path else []),
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
        """Plain dict of the fields (JSON-serialisable; ``api_options`` a dict of its own)."""
        return asdict(self)

    @classmethod
    def setting_names(cls) -> list[str]:
        """Names of every setting of the flat form (``flat``): the portable fields and every
        API's options."""
        portable = [f.name for f in fields(cls) if f.name != "api_options"]
        return portable + list(SETTINGS_OF_APIS)

    @classmethod
    def from_overrides(cls, base: dict[str, Any], overrides: dict[str, Any]) -> TrainSpec:
        """``TrainSpec.flat(**base | overrides)``, refusing unknown override keys: each with the
        nearest setting's name, then the settings ``base`` leaves to overrides."""
        names = cls.setting_names()
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            guesses = [
                f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)
                for key in unknown
                for close in [difflib.get_close_matches(key, names, n=1, cutoff=0.75)]
            ]
            free = ", ".join(name for name in names if name not in base)
            raise SpecError(f"overrides: unknown field(s) {', '.join(guesses)}; valid: {free}")
        return cls.flat(**(base | overrides))

    # -- normalisation -------------------------------------------------------------------------

    def _bind_options(self) -> None:
        """A concrete API always has its options object (its defaults when none is given)."""
        if self.api in OPTIONS_OF_API:
            self.api_options = bind(self.api_options, self.api)
        elif self.api_options is not None and not isinstance(self.api_options, ApiOptions):
            raise SpecError(
                f"TrainSpec.api_options={self.api_options!r} is invalid: must be "
                "TrainJobOptions, PyTorchJobOptions, TFJobOptions or XGBoostJobOptions",
                field="api_options",
            )
        elif self.api == "auto" and isinstance(self.api_options, TFJobOptions | XGBoostJobOptions):
            self.api_options = options_from_settings("auto", asdict(self.api_options))

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
            gpus = self.gpus_per_worker if isinstance(self.gpus_per_worker, int) else 0
            self.nproc_per_node = sizing.processes_per_node(
                None, gpus, one_per_pod=self.one_process_per_pod
            )
        self._default_resources()
        if self.shm_size == "auto":
            self.shm_size = self._auto_shm()
        self.pvcs = [PvcMount.coerce(p) for p in self.pvcs]
        try:
            self.pod_extras = PodExtras.coerce(self.pod_extras)
        except ValueError as exc:
            raise SpecError(f"TrainSpec.{exc}") from exc
        self.tolerations = [
            parse_toleration(t) if isinstance(t, str) else t for t in self.tolerations
        ]
        self.capabilities = [str(c).upper() for c in self.capabilities]
        self.args = [str(a) for a in self.args]
        if self.shm_size == "":
            self.shm_size = None
        for attr in ("env", "annotations", "labels", "node_selector"):
            setattr(self, attr, {str(k): str(v) for k, v in getattr(self, attr).items()})

    def _default_resources(self) -> None:
        """Requests where none are given (never BestEffort); qos=guaranteed: limits = requests."""
        gpus = self.gpus_per_worker if isinstance(self.gpus_per_worker, int) else 0
        processes = self.nproc_per_node if isinstance(self.nproc_per_node, int) else 1
        if self.cpu_request is None and self.cpu_limit is None:
            self.cpu_request = sizing.default_cpu(gpus, processes)
        if self.memory_request is None and self.memory_limit is None:
            shm = self.shm_size if self.shm_size not in ("auto", None, "") else None
            self.memory_request = sizing.default_memory(gpus, processes, shm)
        if self.qos == "guaranteed":
            for request, limit in (
                ("cpu_request", "cpu_limit"),
                ("memory_request", "memory_limit"),
            ):
                if getattr(self, limit) is None:
                    setattr(self, limit, getattr(self, request))
                if getattr(self, request) is None:
                    setattr(self, request, getattr(self, limit))

    def _auto_shm(self) -> str:
        """2Gi of /dev/shm per process, at most half the memory request (it counts against it)."""
        nproc = self.nproc_per_node if isinstance(self.nproc_per_node, int) else 1
        memory = self.memory_request or self.memory_limit
        try:
            return sizing.auto_shm(nproc, memory if isinstance(memory, str) else None)
        except ValueError:  # a bad memory quantity is reported by its own check
            return sizing.auto_shm(nproc, None)
