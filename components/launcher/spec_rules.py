"""The rules a ``TrainSpec`` follows: the values its fields may take, what each cluster API
cannot express (refused with the alternative, never dropped), and the checks run when a spec is
built. Every error names the field, the value and the fix.

``TrainSpec`` (``components.launcher.spec``) inherits the checks from ``SpecChecks``; the names
here are re-exported there.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from components import DEFAULT_IMAGE
from components.launcher import monitoring, pod_extras, sizing
from components.launcher.names import (
    DNS1035,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    LABEL_VALUE,
    qualified_name_ok,
)
from kfp_ddp.s3_uri import s3_uri_problem

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
RESTART_POLICIES = ("OnFailure", "ExitCode", "Never", "Always")
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
"""Kubernetes' Pod Security Standards, strictest first."""
QOS_CLASSES = ("burstable", "guaranteed")
CAPABILITIES = ("IPC_LOCK",)
"""Capabilities a training container may add (explicit opt-in, pod_security=privileged)."""
NODE_ACCESS_FIELDS = ("pod_security", "capabilities", "host_network", "stage_cache_host_path")
"""Fields that open the node (a weaker Pod Security level, capabilities, the node's network or
file system): set by whoever compiles a pipeline or runs the launcher, never by a UI parameter."""
SYSTEM_PATHS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/etcd",
    "/var/lib/kubelet",
    "/var/log",
    "/var/run",
)
"""Node folders a hostPath cache may never be in (the node's system, the kubelet's and the
container runtime's state, logs); the cache wants a folder of its own, e.g. /mnt/kfp-ddp-cache."""
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
    "pod_security": POD_SECURITY_LEVELS,
    "qos": QOS_CLASSES,
}
"""Fields whose value must be one of a fixed set (the CLI shows them as choices)."""
STAGE_ROOT = "/stage"
"""Where a node stages its data (stage_data_uri) on its own disk."""
STAGED_DATA = f"{STAGE_ROOT}/current"
"""The staged data set as the trainer sees it (a symlink to the frozen folder)."""
STAGE_CACHE = "/stage-cache"
"""Where an admin's hostPath cache (stage_cache_host_path) is mounted: the staged data sets live
there between pods; the link to this pod's data set and its outputs stay on its own emptyDir."""
STAGE_CACHE_KEEP = 2
"""Data sets (frozen listings) per source a hostPath cache keeps: the one staged and one older
that a job still training may read; older ones are evicted, unless in use."""
NODE_OUTPUT = f"{STAGE_ROOT}/output"
"""A node's own output folder (same disk as its staged data) when no volume is shared: the
trainer mirrors its checkpoints and model to S3 (--checkpoint-uri) from there."""
STAGE_SYNC_CACHE = f"{STAGE_ROOT}/.s3-sync-cache"
"""The stager's hash cache (``S3SYNC_CACHE_DIR``: one entry per file of the data set): on the
staging volume, which grows with the data set, rather than in HOME's bounded emptyDir."""
IMAGE_HOME = "/home/kfp-ddp"
"""HOME of the image's kfp-ddp user (the Dockerfile); XDG_CACHE_HOME and every cache folder the
image names (Triton, TorchInductor, torch, matplotlib) are inside it."""


class ScratchDir(NamedTuple):
    """A folder the containers write although their root file system is read-only: an emptyDir
    of every pod, mounted into every container the launcher renders."""

    volume: str
    path: str
    size_gi: int
    """The emptyDir's sizeLimit in GiB (counted in the pod's ephemeral-storage, see sizing)."""
    holds: str
    """What is written there (named by the error that refuses another volume at its path)."""


SCRATCH_DIRS = (
    ScratchDir(
        volume="tmp",
        path="/tmp",
        size_gi=sizing.TMP_GI,
        holds="temporary files: Python's tempfile, torchrun's log folder, the C compiler of "
        "Triton and TorchInductor",
    ),
    ScratchDir(
        volume="home",
        path=IMAGE_HOME,
        size_gi=sizing.HOME_GI,
        holds="HOME and its caches: Triton, TorchInductor, torch, matplotlib, CUDA's JIT cache",
    ),
)
"""Every container's root file system is read-only (``readOnlyRootFilesystem``): these, /dev/shm
and the job's volumes (staging, PVCs) are all it may write."""
SCRATCH_ENV = {"HOME": IMAGE_HOME, "TMPDIR": "/tmp"}
"""Set in every container unless ``env`` sets them: whatever the image says, a program's home and
temporary files land on the scratch emptyDirs."""

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
        "pytorch_master": "a TrainJob's nodes meet through the torch-distributed runtime's own "
        "rendezvous (PET_MASTER_ADDR: node 0); there is no Master replica to ask for",
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
        "pytorch_master": "a TFJob's first replica is its Chief (always there)",
    },
}
"""API → field → why that API cannot express the field, and the alternative."""


class SpecError(ValueError):
    """A TrainSpec value is invalid; the message names the field, the value and the fix.

    ``field``: the TrainSpec field (or the training step's input) it concerns, where one is to
    blame; None otherwise. Callers name their own setting from it, never from the message.
    """

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class SpecChecks:
    """The validation of ``TrainSpec`` (mixed into it): ``_check`` runs on construction."""

    def _fail(self, name: str, why: str) -> None:
        raise SpecError(f"TrainSpec.{name}={getattr(self, name)!r} is invalid: {why}", field=name)

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
        self._check_pod_security()
        self._check_scheduling()
        self._check_policies()
        self._check_api_support()
        for name, why in monitoring.spec_problems(self):
            self._fail(name, why)
        for name, why in pod_extras.spec_problems(self):
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
            replica = "worker" if self.workers > 1 or self.workers_only else "master"
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
        names = ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "shm_size")
        sizes = {name: self._quantity(name) for name in names}
        for req, lim in (("cpu_request", "cpu_limit"), ("memory_request", "memory_limit")):
            if sizes[req] is not None and sizes[lim] is not None and sizes[req] > sizes[lim]:
                self._fail(req, f"must not exceed {lim}={getattr(self, lim)!r}")
            if self.qos == "guaranteed" and sizes[req] != sizes[lim]:
                self._fail(
                    lim,
                    f"qos=guaranteed needs limits equal to requests ({req}="
                    f"{getattr(self, req)!r}): leave {lim} unset, or use qos=burstable",
                )
        for name in ("ephemeral_storage", "checkpoint_space"):
            value = self._quantity(name)
            if value is not None and value <= 0:
                self._fail(name, "must be a positive size such as 20Gi")
        shm = sizes["shm_size"]
        if shm is not None and shm <= 0:
            self._fail("shm_size", "must be positive, or None for the container runtime's 64Mi")
        for name in ("memory_request", "memory_limit"):
            if shm is not None and sizes[name] is not None and shm >= sizes[name]:
                self._fail(
                    "shm_size",
                    f"/dev/shm is memory and counts against the pod's memory ({name}="
                    f"{getattr(self, name)!r}): use a smaller shm_size, or more memory",
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

    def _check_pod_security(self) -> None:
        """User, capabilities and node access against the Pod Security level asked for."""
        self._int("run_as_user", minimum=0, optional=True)
        self._int("run_as_group", minimum=0, optional=True)
        if self.pod_security == "restricted" and self.run_as_user == 0:
            self._fail(
                "run_as_user",
                "restricted Pod Security needs a non-root user: use the image's kfp-ddp user "
                "(1000), or pod_security=baseline for an image that must run as root",
            )
        for capability in self.capabilities:
            if capability not in CAPABILITIES:
                self._fail("capabilities", f"{capability!r}: only {', '.join(CAPABILITIES)}")
        privileged = self.pod_security == "privileged"
        why = (
            "{what} is refused by the {level} Pod Security Standard (baseline refuses it too): set "
            "pod_security=privileged, and run the job in a namespace that enforces privileged "
            "(pod-security.kubernetes.io/enforce: privileged)"
        )
        if self.capabilities and not privileged:
            what = f"adding {', '.join(self.capabilities)}"
            self._fail("capabilities", why.format(what=what, level=self.pod_security))
        if self.host_network is True and not privileged:
            self._fail(
                "host_network", why.format(what="the node's network", level=self.pod_security)
            )
        if self.stage_cache_host_path is not None and not privileged:
            what = "a hostPath volume (the node's file system)"
            self._fail("stage_cache_host_path", why.format(what=what, level=self.pod_security))

    def _check_staging(self) -> None:
        uri = self.stage_data_uri
        problem = uri is not None and s3_uri_problem(uri, prefix_required=True)
        if problem:
            self._fail("stage_data_uri", f"must be an s3://bucket/prefix URI ({problem})")
        host = self.stage_cache_host_path
        if host is not None:
            problem = _host_path_problem(host)
            if problem:
                self._fail("stage_cache_host_path", problem)
        if host is not None and uri is None:
            self._fail("stage_cache_host_path", "caches staged data: set stage_data_uri too")
        self._int("stage_data_bytes", minimum=0, optional=True, maximum=2**63 - 1)
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
        if self.stage_cache_host_path:
            seen.add(STAGE_CACHE)
        for p in self.pvcs:
            if len(p.claim) > 253 or not DNS1123_SUBDOMAIN.match(p.claim):
                self._fail("pvcs", f"claim {p.claim!r} is not a valid PVC name")
            if not p.path.startswith("/") or p.path in seen or p.path == "/dev/shm":
                self._fail(
                    "pvcs",
                    f"mount path {p.path!r} must be absolute, unique, not /dev/shm and not "
                    f"{STAGE_ROOT} with stage_data_uri",
                )
            scratch = scratch_dir_at(p.path)
            if scratch:
                self._fail("pvcs", f"mount path {p.path!r}: {scratch_clash(scratch)}")
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


def scratch_dir_at(path: Any) -> ScratchDir | None:
    """The scratch folder mounted exactly at ``path`` (None: none; a folder below one is fine)."""
    if not isinstance(path, str):
        return None
    return next((d for d in SCRATCH_DIRS if d.path == path.rstrip("/")), None)


def scratch_clash(scratch: ScratchDir) -> str:
    """Why a volume of the user's may not take a scratch folder's path, and what to do instead."""
    return (
        f"the pods mount their own emptyDir {scratch.volume!r} there ({scratch.holds}), as every "
        "container's root file system is read-only: mount the volume at another path (a folder "
        f"below {scratch.path} is fine), and point the program there (e.g. env "
        "TORCHINDUCTOR_CACHE_DIR for a cache kept between runs)"
    )


def _host_path_problem(path: Any) -> str:
    """What is wrong with a hostPath cache folder ('' when nothing)."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "must be an absolute folder of its own, such as /mnt/kfp-ddp-cache"
    parts = [p for p in path.split("/") if p]
    if ".." in parts or "." in parts:
        return "must be a plain absolute path (no . or ..)"
    if len(parts) < 2:
        return "must be a folder of its own at least two levels deep, such as /mnt/kfp-ddp-cache"
    normal = "/" + "/".join(parts)
    for system in SYSTEM_PATHS:
        if normal == system or normal.startswith(system + "/"):
            return (
                f"is inside {system}, a system folder of the node (the node's own files, the "
                "kubelet's or the container runtime's state): use a folder of its own, such as "
                "/mnt/kfp-ddp-cache"
            )
    return ""


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
