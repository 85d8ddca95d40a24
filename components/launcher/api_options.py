"""What only one cluster API can say: ``TrainJobOptions``, ``PyTorchJobOptions``, ``TFJobOptions``,
``XGBoostJobOptions``, ``RayJobOptions``, ``MPIJobOptions``.

A ``TrainSpec`` holds what every API runs (image, command, nodes, resources, volumes, security)
and one of these objects in ``api_options``: the settings of its API alone. An option that an API
does not have cannot be given to it: ``TrainJobOptions(backoff_limit=2)`` is a TypeError, and
each object checks its own values when it is built (``SpecError`` naming the setting).

The flat form of a spec (the launcher's CLI flags, the training step's ``overrides_json``, a
plain dict) names every setting at the top level; ``options_from_settings`` sorts its API
settings into the options object of the spec's API, and refuses one that API lacks with what the
API offers instead (``INSTEAD``, on each class: how that API says the same thing, if it can).
``api="auto"`` takes the first of TrainJob, PyTorchJob that can express every setting given;
``bind`` moves options to another API when the cluster decides (again refusing what it lacks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from components.launcher.names import DNS1123_LABEL, DNS1123_SUBDOMAIN
from components.launcher.spec_rules import (
    CLEAN_POD_POLICIES,
    ML_POLICIES,
    MPI_IMPLEMENTATIONS,
    RESTART_POLICIES,
    RUNTIME_KINDS,
    SpecError,
    check_int,
    fail,
    quantity,
)

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
_V2_RUNTIME = "runtimes are a Kubeflow Trainer v2 concept; use api=trainjob"
_ML_POLICY = (
    "an mlPolicy (MPI, XGBoost...) is a Kubeflow Trainer v2 runtime's: use api=trainjob with "
    "such a runtime (runtime_name=deepspeed-distributed for MPI, xgboost-distributed for "
    "XGBoost, or your own)"
)
_XGB_ELASTIC = (
    "an XGBoostJob has a fixed number of workers (XGBoost's tracker waits for all of them): set "
    "workers, and let a restarted job resume from its checkpoint (xgb.train(xgb_model=...))"
)
_TF_RUNTIME = (
    "runtimes are a Kubeflow Trainer v2 concept, and Trainer v2 has no TensorFlow runtime; a TFJob "
    "runs on the Training Operator v1"
)
_TF_ELASTIC = (
    "elastic training is torchrun's (a PyTorchJob's elasticPolicy); a TFJob has a fixed number "
    "of workers: set workers, and let a restarted replica resume from its checkpoint (Keras "
    "BackupAndRestore or tf.train.CheckpointManager)"
)


_MPIJOB_ONLY = "an MPIJob's setting: use api=mpijob (the MPI Operator) for an MPI program"
_RAY_HEAD = ("ray_head_cpu", "ray_head_memory")
_RAYJOB_ONLY = "the Ray head is a RayJob's: use api=rayjob (KubeRay) for a Ray program"
_TRAINJOB_MPI = {
    "mpi_implementation": "mlPolicy.mpi.mpiImplementation",
    "mpi_worker_command": "its node pods' command",
    "ssh_auth_mount_path": "mlPolicy.mpi.sshAuthMountPath",
}
"""What a TrainJob's MPI runtime says instead of an MPIJob's option."""


def _in_your_mpi_runtime(name: str) -> str:
    return (
        f"a TrainJob's MPI runtime says it ({_TRAINJOB_MPI[name]}): set it in your runtime and "
        "set runtime_name to it"
    )


def _name(options: Any, name: str, pattern: Any, limit: int, example: str) -> None:
    value = getattr(options, name)
    if value is not None and (
        not isinstance(value, str) or len(value) > limit or not pattern.match(value)
    ):
        fail(options, name, f"must be a DNS-1123 name such as {example}")


def _choice(options: Any, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(options, name)
    if value is not None and value not in allowed:
        fail(options, name, f"allowed: {', '.join(allowed)}")


@dataclass(frozen=True, kw_only=True)
class TrainJobOptions:
    """What only a Kubeflow Trainer v2 ``TrainJob`` says: the runtime it runs on."""

    API: ClassVar[str] = "trainjob"
    INSTEAD: ClassVar[dict[str, str]] = {
        **dict.fromkeys(_RAY_HEAD, _RAYJOB_ONLY),
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
        "pytorch_master": "a TrainJob's nodes meet through the torch-distributed runtime's own "
        "rendezvous (PET_MASTER_ADDR: node 0); there is no Master replica to ask for",
        **{name: _in_your_mpi_runtime(name) for name in _TRAINJOB_MPI},
    }
    """Other APIs' options → how a TrainJob says it instead (or why it cannot)."""

    runtime_name: str | None = None
    """TrainJob runtimeRef name (None: the ClusterTrainingRuntime torch-distributed)."""
    runtime_kind: str | None = None
    """TrainJob runtimeRef kind: ClusterTrainingRuntime or TrainingRuntime (None: the former)."""
    ml_policy: str | None = None
    """The runtime's mlPolicy: ``torch`` (torchrun's PET_* env on every node), ``mpi`` (a launcher
    pod runs the command under mpirun, node pods run sshd), ``xgboost`` (the DMLC_* env of
    XGBoost's collective on every node), ``jax``, ``flux`` or ``none`` (numNodes only). None:
    known from runtime_name for Kubeflow Trainer's own runtimes (``RUNTIME_POLICIES``); for any
    other, pre-flight reads the runtime and refuses a job that does not suit it."""

    RUNTIME_POLICIES: ClassVar[dict[str, str]] = {
        "torch-distributed": "torch",
        "deepspeed-distributed": "mpi",
        "mlx-distributed": "mpi",
        "xgboost-distributed": "xgboost",
        "jax-distributed": "jax",
        "kfp-ddp-mpi": "mpi",
    }
    """Kubeflow Trainer v2.3's own ClusterTrainingRuntimes and ours (manifests/) → their
    mlPolicy."""

    def __post_init__(self) -> None:
        _name(self, "runtime_name", DNS1123_SUBDOMAIN, 253, "torch-distributed")
        _choice(self, "runtime_kind", RUNTIME_KINDS)
        _choice(self, "ml_policy", ML_POLICIES)

    @property
    def policy(self) -> str | None:
        """The runtime's mlPolicy: given, or known from the runtime's name (None: unknown)."""
        if self.ml_policy is not None:
            return self.ml_policy
        if self.runtime_kind in (None, "ClusterTrainingRuntime"):
            return self.RUNTIME_POLICIES.get(self.runtime_name or "torch-distributed")
        return None

    @property
    def is_mpi(self) -> bool:
        """Whether the runtime is an MPI one (its launcher pod is patched like the nodes)."""
        return self.policy == "mpi"

    @property
    def is_xgboost(self) -> bool:
        """Whether the runtime gives every node XGBoost's DMLC_* env."""
        return self.policy == "xgboost"


@dataclass(frozen=True, kw_only=True)
class OperatorOptions:
    """What the Training Operator v1 jobs (PyTorchJob, TFJob) say alike: their run policy, gang
    scheduling, restart policy and the node's network."""

    API: ClassVar[str] = ""
    INSTEAD: ClassVar[dict[str, str]] = {}

    scheduler_name: str | None = None
    """PyTorchJob/TFJob pod schedulerName (e.g. volcano); turns on gang scheduling
    (schedulingPolicy)."""
    min_available: int | None = None
    """PyTorchJob/TFJob gang size: pods schedulable together. None with a scheduler: all pods."""
    queue: str | None = None
    """PyTorchJob/TFJob runPolicy.schedulingPolicy.queue (e.g. the Volcano queue)."""
    priority_class: str | None = None
    """PyTorchJob/TFJob runPolicy.schedulingPolicy.priorityClass."""
    host_network: bool = False
    """Use the node's network (RDMA/perf); sets dnsPolicy ClusterFirstWithHostNet (PyTorchJob).
    Needs pod_security=privileged (baseline and restricted refuse host namespaces)."""
    restart_policy: str | None = None
    """PyTorchJob/TFJob replica restart policy: OnFailure, ExitCode, Never or Always (None:
    ExitCode for a PyTorchJob — our trainer's exit codes 1-127 are permanent — and OnFailure for
    a TFJob)."""
    backoff_limit: int | None = None
    """PyTorchJob/TFJob restarts before the job is marked Failed (None: 3)."""
    clean_pod_policy: str | None = None
    """PyTorchJob/TFJob pods deleted when the job finishes: Running, All or None (None: Running, so
    finished pods stay for their logs)."""
    ttl_seconds_after_finished: int | None = None
    """PyTorchJob/TFJob: the operator deletes the finished job after this many seconds."""

    def __post_init__(self) -> None:
        _name(self, "scheduler_name", DNS1123_SUBDOMAIN, 253, "volcano")
        _name(self, "priority_class", DNS1123_SUBDOMAIN, 253, "high-priority")
        _name(self, "queue", DNS1123_LABEL, 63, "team-a")
        check_int(self, "min_available", optional=True, minimum=1)
        check_int(self, "backoff_limit", optional=True, minimum=0)
        check_int(self, "ttl_seconds_after_finished", optional=True, minimum=0)
        _choice(self, "restart_policy", RESTART_POLICIES)
        _choice(self, "clean_pod_policy", CLEAN_POD_POLICIES)
        if not isinstance(self.host_network, bool):
            fail(self, "host_network", "must be true or false")

    @property
    def gang(self) -> bool:
        """Whether the job asks for gang scheduling (a schedulingPolicy)."""
        return bool(self.scheduler_name or self.queue or self.priority_class or self.min_available)


@dataclass(frozen=True, kw_only=True)
class PyTorchJobOptions(OperatorOptions):
    """What only a Training Operator v1 ``PyTorchJob`` says: its Master, elastic training."""

    API: ClassVar[str] = "pytorchjob"
    INSTEAD: ClassVar[dict[str, str]] = {
        **dict.fromkeys(_RAY_HEAD, _RAYJOB_ONLY),
        "runtime_name": _V2_RUNTIME,
        "runtime_kind": _V2_RUNTIME,
        "ml_policy": _ML_POLICY,
        "ps_replicas": _PS,
        **dict.fromkeys(_TRAINJOB_MPI, _MPIJOB_ONLY),
    }

    pytorch_master: bool = False
    """PyTorchJob layout: a Master and workers-1 Workers (the operator sets MASTER_ADDR, RANK and
    WORLD_SIZE, for programs that read them). Default: Workers only, meeting through torchrun's
    c10d rendezvous at worker-0. With a Master the v1.9 operator adds its init-pytorch container
    (no securityContext) to every Worker: restricted Pod Security refuses it unless the operator
    runs with --pytorch-init-container-template-file (see the README)."""
    elastic_min_replicas: int | None = field(default=None, metadata={"old_flag": "--elastic-min"})
    """PyTorchJob elastic training: lower bound of pods (set with elastic_max_replicas)."""
    elastic_max_replicas: int | None = field(default=None, metadata={"old_flag": "--elastic-max"})
    """PyTorchJob elastic training: upper bound of pods."""
    max_restarts: int | None = None
    """PyTorchJob elastic training: torchrun's --max-restarts (elastic only)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.elastic:
            for name in ("elastic_min_replicas", "elastic_max_replicas"):
                if getattr(self, name) is None:
                    fail(
                        self,
                        "elastic_min_replicas",
                        "elastic training needs both elastic_min_replicas and elastic_max_replicas",
                    )
                check_int(self, name, optional=True, minimum=1)
        elif self.max_restarts is not None:
            fail(
                self,
                "max_restarts",
                "is torchrun's elastic --max-restarts; set elastic_min_replicas and "
                "elastic_max_replicas too, or use backoff_limit for non-elastic jobs",
            )
        check_int(self, "max_restarts", optional=True, minimum=0)
        if not isinstance(self.pytorch_master, bool):
            fail(self, "pytorch_master", "must be true or false")

    @property
    def elastic(self) -> bool:
        """Whether the job uses the operator's elastic policy (torchrun c10d rendezvous)."""
        return self.elastic_min_replicas is not None or self.elastic_max_replicas is not None


@dataclass(frozen=True, kw_only=True)
class TFJobOptions(OperatorOptions):
    """What only a Training Operator v1 ``TFJob`` says: its parameter servers."""

    API: ClassVar[str] = "tfjob"
    INSTEAD: ClassVar[dict[str, str]] = {
        **dict.fromkeys(_RAY_HEAD, _RAYJOB_ONLY),
        "runtime_name": _TF_RUNTIME,
        "runtime_kind": _TF_RUNTIME,
        "ml_policy": _ML_POLICY,
        "elastic_min_replicas": _TF_ELASTIC,
        "elastic_max_replicas": _TF_ELASTIC,
        "max_restarts": _TF_ELASTIC,
        "pytorch_master": "a TFJob's first replica is its Chief (always there)",
        **dict.fromkeys(_TRAINJOB_MPI, _MPIJOB_ONLY),
    }

    ps_replicas: int = 0
    """TFJob parameter-server (PS) pods, besides the workers."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ps_replicas is None or isinstance(self.ps_replicas, bool):
            fail(self, "ps_replicas", "must be an integer >= 0")
        check_int(self, "ps_replicas", optional=True, minimum=0, maximum=10_000)


@dataclass(frozen=True, kw_only=True)
class XGBoostJobOptions(OperatorOptions):
    """What only a Training Operator v1 ``XGBoostJob`` says: nothing beyond the v1 run policy
    (its Master is always there and runs XGBoost's tracker)."""

    API: ClassVar[str] = "xgboostjob"
    INSTEAD: ClassVar[dict[str, str]] = {
        **dict.fromkeys(_RAY_HEAD, _RAYJOB_ONLY),
        "runtime_name": _V2_RUNTIME + " (runtime_name=xgboost-distributed runs XGBoost there)",
        "runtime_kind": _V2_RUNTIME,
        "ml_policy": _ML_POLICY,
        "elastic_min_replicas": _XGB_ELASTIC,
        "elastic_max_replicas": _XGB_ELASTIC,
        "max_restarts": _XGB_ELASTIC,
        "ps_replicas": _PS,
        "pytorch_master": "an XGBoostJob's first replica is its Master (always there)",
        **dict.fromkeys(_TRAINJOB_MPI, _MPIJOB_ONLY),
    }


_RAY_GANG = (
    "a RayJob's gang scheduling is KubeRay's batch-scheduler integration, which the launcher does "
    "not set: queue the job with Kueue (kueue_queue), which admits a RayJob whole"
)
_RAY_ELASTIC = (
    "a RayJob here has a fixed worker group (Ray Train's workers = workers x nproc_per_node): "
    "set workers, and let a retried step resume from the trainer's checkpoints"
)


@dataclass(frozen=True, kw_only=True)
class RayJobOptions:
    """What only a KubeRay ``RayJob`` says: its retries, how long its finished Ray cluster is
    kept, and the size of its Ray head."""

    API: ClassVar[str] = "rayjob"
    INSTEAD: ClassVar[dict[str, str]] = {
        "runtime_name": _V2_RUNTIME,
        "runtime_kind": _V2_RUNTIME,
        "ml_policy": _ML_POLICY,
        "elastic_min_replicas": _RAY_ELASTIC,
        "elastic_max_replicas": _RAY_ELASTIC,
        "max_restarts": _RAY_ELASTIC,
        "scheduler_name": _RAY_GANG,
        "min_available": _RAY_GANG,
        "queue": _RAY_GANG,
        "priority_class": "a RayJob has no priority class the launcher sets: use a Kueue "
        "WorkloadPriorityClass (labels kueue.x-k8s.io/priority-class=NAME)",
        "host_network": "the launcher does not run Ray pods on the node's network",
        "restart_policy": "KubeRay recreates a lost Ray pod itself; a failed Ray job fails the "
        "RayJob (backoff_limit: how many new Ray clusters it may try)",
        "clean_pod_policy": "a RayJob's Ray cluster is deleted when the job ends "
        "(shutdownAfterJobFinishes), after ttl_seconds_after_finished",
        "ps_replicas": _PS,
        "pytorch_master": "a RayJob's first pod is its Ray head (always there; it trains nothing)",
        **dict.fromkeys(_TRAINJOB_MPI, _MPIJOB_ONLY),
    }

    backoff_limit: int | None = None
    """RayJob retries, each on a new Ray cluster (None: 0). KubeRay retries any failure; the
    launcher suspends the RayJob when its program exited with a permanent code (1-127) instead.
    A retry resumes from the checkpoints."""
    ttl_seconds_after_finished: int | None = None
    """RayJob: how long the finished job's Ray cluster (its pods, GPUs included) is kept
    (None: 60 s)."""
    ray_head_cpu: str | None = None
    """RayJob: the Ray head's CPU request (None: 500m). The head runs Ray's GCS and dashboard and
    the job's driver: your Ray program's own code outside its tasks runs there."""
    ray_head_memory: str | None = None
    """RayJob: the Ray head's memory, request and limit (None: 2Gi)."""

    def __post_init__(self) -> None:
        check_int(self, "backoff_limit", optional=True, minimum=0)
        check_int(self, "ttl_seconds_after_finished", optional=True, minimum=0)
        for name in ("ray_head_cpu", "ray_head_memory"):
            if quantity(self, name) == 0:
                fail(self, name, "must be more than 0 (the head runs the GCS and the driver)")


_MPI_ELASTIC = (
    "an MPIJob has a fixed number of workers (mpirun's hostfile): set workers, and let a "
    "retried step resume from the trainer's checkpoints"
)
_MPI_RUNTIME = (
    "runtimes are a Kubeflow Trainer v2 concept: an MPIJob runs on the MPI Operator (Trainer v2 "
    "runs MPI as api=trainjob with runtime_name=kfp-ddp-mpi)"
)
MPIJOB_RESTART_POLICIES = ("Never", "OnFailure")
"""What an MPIJob's launcher may restart with (the MPI Operator's own rule)."""


@dataclass(frozen=True, kw_only=True)
class MPIJobOptions(OperatorOptions):
    """What an MPI Operator v2 ``MPIJob`` (``kubeflow.org/v2beta1``) says: the v1 run policy
    (backoff, clean-up, TTL, gang scheduling), the launcher's restart policy, the workers'
    network, the MPI implementation."""

    API: ClassVar[str] = "mpijob"
    INSTEAD: ClassVar[dict[str, str]] = {
        **dict.fromkeys(_RAY_HEAD, _RAYJOB_ONLY),
        "runtime_name": _MPI_RUNTIME,
        "runtime_kind": _MPI_RUNTIME,
        "ml_policy": _MPI_RUNTIME,
        "elastic_min_replicas": _MPI_ELASTIC,
        "elastic_max_replicas": _MPI_ELASTIC,
        "max_restarts": _MPI_ELASTIC,
        "ps_replicas": _PS,
        "pytorch_master": "an MPIJob's first pod is its launcher (always there; it runs mpirun)",
    }

    mpi_implementation: str | None = None
    """MPIJob: the MPI of the job's image, OpenMPI, Intel or MPICH (None: OpenMPI); the operator
    writes the hostfile and the launcher's variables for it. Our trainer runs under OpenMPI only
    (``trainer.mpirun``); Intel MPI and MPICH run your ``command``."""

    mpi_worker_command: list[str] | None = None
    """MPIJob: how a worker starts sshd in your image (None: as in our image's MPI variant,
    ``image/mpi/``, ready once sshd wrote its pid file; yours: ready once it runs)."""
    ssh_auth_mount_path: str | None = None
    """MPIJob: where the job's SSH key is mounted: the ``~/.ssh`` of your image's user (None:
    ``/home/kfp-ddp/.ssh``, our image's)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _choice(self, "mpi_implementation", MPI_IMPLEMENTATIONS)
        command = self.mpi_worker_command
        if command is not None and (
            not isinstance(command, list | tuple)
            or not command
            or not all(isinstance(word, str) and word for word in command)
        ):
            fail(self, "mpi_worker_command", "must be a non-empty list of strings")
        path = self.ssh_auth_mount_path
        if path is not None and (not isinstance(path, str) or not path.startswith("/")):
            fail(self, "ssh_auth_mount_path", "must be an absolute path, e.g. /home/mpiuser/.ssh")
        if self.restart_policy is not None and self.restart_policy not in MPIJOB_RESTART_POLICIES:
            fail(
                self,
                "restart_policy",
                f"an MPIJob's launcher restarts with {' or '.join(MPIJOB_RESTART_POLICIES)} (the "
                "MPI Operator's rule); its workers are never restarted alone (mpirun cannot "
                "take a worker back)",
            )


ApiOptions = (
    TrainJobOptions
    | PyTorchJobOptions
    | TFJobOptions
    | XGBoostJobOptions
    | RayJobOptions
    | MPIJobOptions
)
OPTIONS_OF_API: dict[str, type[ApiOptions]] = {
    cls.API: cls
    for cls in (
        TrainJobOptions,
        PyTorchJobOptions,
        TFJobOptions,
        XGBoostJobOptions,
        RayJobOptions,
        MPIJobOptions,
    )
}
"""Concrete API → its options class."""
AUTO_ORDER = ("trainjob", "pytorchjob")
"""What ``api="auto"`` may become, in the launcher's order of preference."""


def option_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


SETTINGS_OF_APIS: dict[str, tuple[str, ...]] = {}
"""Every API option's name → the APIs that have it."""
for _api, _cls in OPTIONS_OF_API.items():
    for _name_ in option_names(_cls):
        SETTINGS_OF_APIS[_name_] = (*SETTINGS_OF_APIS.get(_name_, ()), _api)


DEFAULTS: dict[str, Any] = {
    f.name: f.default for cls in OPTIONS_OF_API.values() for f in dataclasses.fields(cls)
}
"""Every API option's default (the same in every API that has it)."""


def _given(name: str, value: Any) -> bool:
    """Whether a flat setting says something: a value other than its option's default (the
    CLI passes every flag, most at their defaults)."""
    default = DEFAULTS[name]
    return value is not None and not (value == default and type(value) is type(default))


def _refusal(api: str, name: str, value: Any) -> SpecError:
    why = OPTIONS_OF_API[api].INSTEAD.get(name) or f"it is an option of {SETTINGS_OF_APIS[name]}"
    return SpecError(
        f"TrainSpec.{name}={value!r} is invalid: api={api} cannot express it: {why}", field=name
    )


def _lacking(api: str, settings: Mapping[str, Any]) -> SpecError | None:
    """The refusal of the first setting given that ``api`` has no option for (None: none)."""
    own = set(option_names(OPTIONS_OF_API[api]))
    for name, value in settings.items():
        if name not in own and _given(name, value):
            return _refusal(api, name, value)
    return None


def _build(api: str, settings: Mapping[str, Any]) -> ApiOptions:
    """``api``'s options from flat settings; a setting it lacks, if given, is refused."""
    refusal = _lacking(api, settings)
    if refusal is not None:
        raise refusal
    cls = OPTIONS_OF_API[api]
    own = set(option_names(cls))
    return cls(**{name: value for name, value in settings.items() if name in own})


def options_from_settings(api: str, settings: Mapping[str, Any]) -> ApiOptions | None:
    """The options object for ``api`` from flat settings (each a name of ``SETTINGS_OF_APIS``).

    ``auto``: the first API of ``AUTO_ORDER`` that can express every setting given (None when
    none is given: the cluster decides); when none can, the refusal of the first.
    """
    if api in OPTIONS_OF_API:
        return _build(api, settings)
    if not any(_given(name, value) for name, value in settings.items()):
        return None
    refusals = []
    for candidate in AUTO_ORDER:
        refusal = _lacking(candidate, settings)
        if refusal is None:
            return _build(candidate, settings)  # its own check of the values may still refuse
        refusals.append(refusal)
    first = refusals[0]
    raise SpecError(
        f"{first} (api=auto becomes a TrainJob or a PyTorchJob, and neither can express what "
        "is set: choose the API that can)",
        field=first.field,
    )


def bind(options: ApiOptions | None, api: str) -> ApiOptions:
    """``options`` for ``api``: as they are, or moved to it (the values both APIs have are kept;
    one it lacks, if set, is refused naming the setting and what ``api`` offers instead)."""
    if isinstance(options, OPTIONS_OF_API[api]):
        return options
    settings = dataclasses.asdict(options) if options is not None else {}
    return _build(api, settings)
