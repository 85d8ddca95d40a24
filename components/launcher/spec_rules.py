"""The rules a ``TrainSpec`` follows: the values its fields may take and the checks run when a
spec is built, across its fields and its API's options (each options object checks its own
values: ``api_options``). Every error names the field, the value and the fix.

``TrainSpec`` (``components.launcher.spec``) runs ``check`` when it is built; the names here are
re-exported there.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, NoReturn

from components import DEFAULT_IMAGE
from components.launcher import monitoring, pod_extras
from components.launcher.names import (
    DNS1035,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    LABEL_VALUE,
    controller_env,
    qualified_name_ok,
)
from components.launcher.pod_paths import (
    host_path_problem,
    scratch_clash,
    scratch_dir_at,
)
from kfp_ddp.image_reference import image_problem
from kfp_ddp.s3_uri import s3_uri_problem

if TYPE_CHECKING:  # the checks read a TrainSpec; spec.py imports this module
    from components.launcher.spec import TrainSpec

APIS = ("auto", "trainjob", "pytorchjob", "tfjob", "xgboostjob", "rayjob", "mpijob")
"""``auto``: TrainJob when the cluster serves Kubeflow Trainer v2, else PyTorchJob (never TFJob)."""
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
ML_POLICIES = ("torch", "mpi", "xgboost", "jax", "flux", "none")
"""A Kubeflow Trainer v2 runtime's mlPolicy (``none``: numNodes only)."""
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
CLEAN_POD_POLICIES = ("Running", "All", "None")
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SPEC_CHOICES: dict[str, tuple[str, ...]] = {
    "api": APIS,
    "nccl_preset": tuple(NCCL_PRESETS),
    "metrics_monitor": monitoring.MONITORS,
    "pod_security": POD_SECURITY_LEVELS,
    "qos": QOS_CLASSES,
}
"""TrainSpec fields whose value must be one of a fixed set."""
MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")
"""What the MPI Operator v0.8 writes an MPIJob's hostfile and launcher variables for."""
CHOICES: dict[str, tuple[str, ...]] = SPEC_CHOICES | {
    "runtime_kind": RUNTIME_KINDS,
    "ml_policy": ML_POLICIES,
    "restart_policy": RESTART_POLICIES,
    "clean_pod_policy": CLEAN_POD_POLICIES,
    "mpi_implementation": MPI_IMPLEMENTATIONS,
}
"""Settings of the flat form (the spec's and its API options') whose value must be one of a
fixed set (the CLI shows them as choices; the options objects check their own)."""
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


class SpecError(ValueError):
    """A TrainSpec value is invalid; the message names the field, the value and the fix.

    ``field``: the TrainSpec field (or the training step's input) it concerns, where one is to
    blame; None otherwise. Callers name their own setting from it, never from the message.
    """

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def fail(spec: Any, name: str, why: str) -> NoReturn:
    """Raise the SpecError of ``spec.<name>`` (a TrainSpec's field or an API option's)."""
    raise SpecError(f"TrainSpec.{name}={getattr(spec, name)!r} is invalid: {why}", field=name)


def check_int(
    spec: Any, name: str, *, minimum: int, optional: bool = False, maximum: int = 2**31 - 1
):
    value = getattr(spec, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        fail(spec, name, f"must be an integer >= {minimum}")
    if not minimum <= value <= maximum:
        fail(spec, name, f"must be between {minimum} and {maximum}")


def check(spec: TrainSpec) -> None:
    """The checks run when a ``TrainSpec`` is built; the first problem raises ``SpecError``."""
    for name, allowed in SPEC_CHOICES.items():
        value = getattr(spec, name)
        if value is not None and value not in allowed:
            fail(spec, name, f"allowed: {', '.join(allowed)}")
    _check_identity(spec)
    _check_sizes(spec)
    _check_env_and_metadata(spec)
    _check_volumes(spec)
    _check_pod_security(spec)
    _check_scheduling(spec)
    _check_policies(spec)
    _check_api_support(spec)
    for name, why in monitoring.spec_problems(spec):
        fail(spec, name, why)
    for name, why in pod_extras.spec_problems(spec):
        fail(spec, name, why)


def _check_identity(spec: TrainSpec) -> None:
    if not isinstance(spec.name, str) or len(spec.name) > 63 or not DNS1035.match(spec.name):
        fail(
            spec,
            "name",
            "must be a DNS-1035 label: lower-case letters, digits and '-', starting with a "
            "letter, ending with a letter or digit, at most 63 characters (e.g. resnet-ddp-1)",
        )
    _check_pod_names(spec)
    if len(spec.namespace) > 63 or not DNS1123_LABEL.match(spec.namespace):
        fail(spec, "namespace", "must be a DNS-1123 label such as kubeflow-user")
    problem = image_problem(spec.image)
    if problem:
        fail(spec, "image", f"must be a container image reference: {problem}")
    if spec.command is not None and (
        not isinstance(spec.command, list)
        or not spec.command
        or not all(isinstance(c, str) and c for c in spec.command)
    ):
        fail(spec, "command", "must be None (the trainer) or a non-empty list of strings")


def _check_pod_names(spec: TrainSpec) -> None:
    """The controllers name pods/hostnames after the job; those must stay <= 63 too."""
    last = max(int(spec.workers) - 1, 0) if isinstance(spec.workers, int) else 0
    if spec.api == "tfjob":  # <job>-chief-0, <job>-worker-<workers-2>, <job>-ps-<ps-1>
        ps = spec.ps_replicas if isinstance(spec.ps_replicas, int) else 0
        suffixes = ["chief-0"]
        if last:
            suffixes.append(f"worker-{last - 1}")
        if ps:
            suffixes.append(f"ps-{ps - 1}")
        longest = max((f"{spec.name}-{suffix}" for suffix in suffixes), key=len)
    elif spec.api == "xgboostjob":  # <job>-master-0, <job>-worker-<workers-2>
        longest = f"{spec.name}-worker-{last - 1}" if last else f"{spec.name}-master-0"
    elif spec.api == "pytorchjob":
        replica = "worker" if spec.workers > 1 or spec.workers_only else "master"
        longest = f"{spec.name}-{replica}-{last}"
    elif spec.api == "rayjob":  # KubeRay's head Service: <job>-<5 characters>-head-svc
        longest = f"{spec.name}-xxxxx-head-svc"
    elif spec.api == "mpijob":  # the launcher's Job and hostname, <job>-worker-N
        longest = max(f"{spec.name}-launcher", f"{spec.name}-worker-{last}", key=len)
    else:  # a TrainJob's JobSet hostname <job>-node-<index>-0 (auto may become either)
        longest = max(f"{spec.name}-node-{last}-0", f"{spec.name}-worker-{last}", key=len)
    if len(longest) > 63:
        fail(
            spec,
            "name",
            f"too long for its pod hostnames ({longest!r} has {len(longest)} > 63 "
            f"characters); use at most {63 - (len(longest) - len(spec.name))} characters",
        )


def _check_sizes(spec: TrainSpec) -> None:
    check_int(spec, "workers", minimum=1, maximum=10_000)
    check_int(spec, "nproc_per_node", minimum=1, maximum=1024)
    check_int(spec, "gpus_per_worker", minimum=0, maximum=1024)
    if spec.gpus_per_worker and (spec.nproc_per_node or 1) > spec.gpus_per_worker:
        fail(
            spec,
            "nproc_per_node",
            f"{spec.nproc_per_node} processes per node but only gpus_per_worker="
            f"{spec.gpus_per_worker} GPUs; use nproc_per_node <= gpus_per_worker",
        )
    for name in ("gpu_resource", "rdma_resource"):
        value = getattr(spec, name)
        if value is not None and (
            "/" not in value or not DNS1123_SUBDOMAIN.match(value.split("/")[0])
        ):
            fail(spec, name, "must be an extended resource name like nvidia.com/gpu")
    if spec.rdma_resource and not spec.rdma:
        fail(spec, "rdma_resource", "is requested only with nccl_preset=infiniband")
    if not ENV_NAME.match(spec.network_interface or "") or "/" in spec.network_interface:
        fail(spec, "network_interface", "must be an interface name such as eth0 or ens5")
    _check_quantities(spec)


def quantity(spec: Any, name: str):
    """The field's value as a number (None when unset); refuses what is no quantity (``spec``:
    a TrainSpec, or an API's options)."""
    from kubernetes.utils import parse_quantity

    value = getattr(spec, name)
    if value is None:
        return None
    try:
        parsed = parse_quantity(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None or value.startswith("-"):
        fail(spec, name, "must be a Kubernetes quantity such as 500m, 4, 16Gi or 1.5")
    return parsed


def _check_quantities(spec: TrainSpec) -> None:
    names = ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "shm_size")
    sizes = {name: quantity(spec, name) for name in names}
    for req, lim in (("cpu_request", "cpu_limit"), ("memory_request", "memory_limit")):
        if sizes[req] is not None and sizes[lim] is not None and sizes[req] > sizes[lim]:
            fail(spec, req, f"must not exceed {lim}={getattr(spec, lim)!r}")
        if spec.qos == "guaranteed" and sizes[req] != sizes[lim]:
            fail(
                spec,
                lim,
                f"qos=guaranteed needs limits equal to requests ({req}="
                f"{getattr(spec, req)!r}): leave {lim} unset, or use qos=burstable",
            )
    for name in ("ephemeral_storage", "checkpoint_space"):
        value = quantity(spec, name)
        if value is not None and value <= 0:
            fail(spec, name, "must be a positive size such as 20Gi")
    shm = sizes["shm_size"]
    if shm is not None and shm <= 0:
        fail(spec, "shm_size", "must be positive, or None for the container runtime's 64Mi")
    for name in ("memory_request", "memory_limit"):
        if shm is not None and sizes[name] is not None and shm >= sizes[name]:
            fail(
                spec,
                "shm_size",
                f"/dev/shm is memory and counts against the pod's memory ({name}="
                f"{getattr(spec, name)!r}): use a smaller shm_size, or more memory",
            )


def _check_env_and_metadata(spec: TrainSpec) -> None:
    for key in spec.env:
        if not ENV_NAME.match(key):
            fail(spec, "env", f"{key!r} is not a valid environment variable name")
    for attr in ("labels", "annotations", "node_selector"):
        for key, value in getattr(spec, attr).items():
            if not qualified_name_ok(key):
                fail(spec, attr, f"key {key!r} is not a valid label/annotation key")
            if attr != "annotations" and (len(value) > 63 or not LABEL_VALUE.match(value)):
                fail(spec, attr, f"value {value!r} of {key!r} is not a valid label value")
    for attr in ("run_id", "task_name"):
        if not isinstance(getattr(spec, attr), str):
            fail(spec, attr, "must be a string")


def _check_pod_security(spec: TrainSpec) -> None:
    """User, capabilities and node access against the Pod Security level asked for."""
    check_int(spec, "run_as_user", minimum=0, optional=True)
    check_int(spec, "run_as_group", minimum=0, optional=True)
    if spec.pod_security == "restricted" and spec.run_as_user == 0:
        fail(
            spec,
            "run_as_user",
            "restricted Pod Security needs a non-root user: use the image's kfp-ddp user "
            "(1000), or pod_security=baseline for an image that must run as root",
        )
    for capability in spec.capabilities:
        if capability not in CAPABILITIES:
            fail(spec, "capabilities", f"{capability!r}: only {', '.join(CAPABILITIES)}")
    privileged = spec.pod_security == "privileged"
    why = (
        "{what} is refused by the {level} Pod Security Standard (baseline refuses it too): set "
        "pod_security=privileged, and run the job in a namespace that enforces privileged "
        "(pod-security.kubernetes.io/enforce: privileged)"
    )
    if spec.capabilities and not privileged:
        what = f"adding {', '.join(spec.capabilities)}"
        fail(spec, "capabilities", why.format(what=what, level=spec.pod_security))
    if spec.operator.host_network is True and not privileged:
        raise SpecError(
            "TrainSpec.host_network=True is invalid: "
            + why.format(what="the node's network", level=spec.pod_security),
            field="host_network",
        )
    if spec.stage_cache_host_path is not None and not privileged:
        what = "a hostPath volume (the node's file system)"
        fail(spec, "stage_cache_host_path", why.format(what=what, level=spec.pod_security))


def _check_staging(spec: TrainSpec) -> None:
    uri = spec.stage_data_uri
    problem = uri is not None and s3_uri_problem(uri, prefix_required=True)
    if problem:
        fail(spec, "stage_data_uri", f"must be an s3://bucket/prefix URI ({problem})")
    host = spec.stage_cache_host_path
    if host is not None:
        problem = host_path_problem(host)
        if problem:
            fail(spec, "stage_cache_host_path", problem)
    if host is not None and uri is None:
        fail(spec, "stage_cache_host_path", "caches staged data: set stage_data_uri too")
    check_int(spec, "stage_data_bytes", minimum=0, optional=True, maximum=2**63 - 1)
    digest = spec.stage_data_digest
    if digest is not None and (uri is None or not re.fullmatch(r"[0-9a-f]{8,64}", digest)):
        fail(
            spec,
            "stage_data_digest",
            "must be the hex listing digest of stage_data_uri (the pipeline's data step "
            "outputs it); leave it unset to train on whatever the nodes find",
        )
    secret = spec.s3_credentials_secret
    if secret is not None and (len(secret) > 253 or not DNS1123_SUBDOMAIN.match(secret)):
        fail(spec, "s3_credentials_secret", "must be a Secret name such as s3-credentials")
    endpoint = spec.s3_endpoint
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        fail(spec, "s3_endpoint", "must be a URL such as https://minio.example.com")


def _check_volumes(spec: TrainSpec) -> None:
    _check_staging(spec)
    seen: set[str] = {STAGE_ROOT} if spec.stage_data_uri else set()
    if spec.stage_cache_host_path:
        seen.add(STAGE_CACHE)
    for p in spec.pvcs:
        if len(p.claim) > 253 or not DNS1123_SUBDOMAIN.match(p.claim):
            fail(spec, "pvcs", f"claim {p.claim!r} is not a valid PVC name")
        if not p.path.startswith("/") or p.path in seen or p.path == "/dev/shm":
            fail(
                spec,
                "pvcs",
                f"mount path {p.path!r} must be absolute, unique, not /dev/shm and not "
                f"{STAGE_ROOT} with stage_data_uri",
            )
        scratch = scratch_dir_at(p.path)
        if scratch:
            fail(spec, "pvcs", f"mount path {p.path!r}: {scratch_clash(scratch)}")
        seen.add(p.path)


def _check_scheduling(spec: TrainSpec) -> None:
    value = spec.service_account
    if value is not None and (len(value) > 253 or not DNS1123_SUBDOMAIN.match(value)):
        fail(spec, "service_account", "must be a DNS-1123 name such as pipeline-runner")
    value = spec.kueue_queue
    if value is not None and (len(value) > 63 or not DNS1123_LABEL.match(value)):
        fail(spec, "kueue_queue", "must be a DNS-1123 label such as team-a")
    for secret in spec.image_pull_secrets:
        if not DNS1123_SUBDOMAIN.match(secret):
            fail(spec, "image_pull_secrets", f"{secret!r} is not a valid Secret name")
    gang = spec.operator.min_available
    if gang is not None and gang > spec.pod_count:
        raise SpecError(
            f"TrainSpec.min_available={gang!r} is invalid: must be <= the job's pods "
            f"({spec.pod_count})",
            field="min_available",
        )
    for i, toleration in enumerate(spec.tolerations):
        problem = _toleration_problem(toleration)
        if problem:
            fail(spec, "tolerations", f"item {i}: {problem}")


def _check_policies(spec: TrainSpec) -> None:
    options = spec.pytorchjob
    if options is not None and options.elastic:
        lo, hi = options.elastic_min_replicas, options.elastic_max_replicas
        if lo is not None and hi is not None and not lo <= spec.workers <= hi:
            fail(
                spec,
                "workers",
                f"must lie within elastic_min_replicas={lo} .. elastic_max_replicas={hi}",
            )
    longest = 2**31 - 1 if spec.api == "rayjob" else 2**63 - 1  # the RayJob CRD's is an int32
    check_int(spec, "active_deadline_seconds", minimum=1, optional=True, maximum=longest)
    check_int(spec, "termination_grace_period_seconds", minimum=0, optional=True)


def _check_api_support(spec: TrainSpec) -> None:
    """What the chosen API asks of the portable settings (its own options check themselves)."""
    controller = controller_env(spec.api, spec.runtime.policy)
    taken = controller.taken(spec.env) if controller is not None else []
    if controller is not None and taken:
        fail(spec, "env", f"{taken} are set by {controller.owner} in every pod; leave them out")
    if spec.api == "trainjob":
        _check_runtime_policy(spec)
    if spec.api == "rayjob" and spec.command is None:
        _check_ray_train_gpus(spec)
    if spec.api == "mpijob" and spec.command is None:
        _check_mpi_implementation(spec)
    if spec.image == DEFAULT_IMAGE:
        _check_image_has_what_the_api_runs(spec)
    if spec.api == "trainjob" and spec.runtime.policy in ("mpi", "xgboost"):
        _check_users_program_on_runtime(spec)
    if spec.api != "auto" and spec.framework != "pytorch":  # auto is checked once bound
        _check_users_program(spec)


def _check_image_has_what_the_api_runs(spec: TrainSpec) -> None:
    """Our default image holds our trainer and torch, not OpenMPI, sshd or Ray."""
    if spec.api == "mpijob" or (spec.api == "trainjob" and spec.runtime.is_mpi):
        job = (
            "an MPIJob's workers run sshd and its launcher"
            if spec.api == "mpijob"
            else (f"on the MPI runtime {spec.runtime.runtime_name!r} the launcher pod runs")
        )
        fail(
            spec,
            "image",
            f"{job} mpirun, which this image lacks: set image to our image's MPI variant "
            f"({DEFAULT_IMAGE}-mpi, or make image-local-mpi), or to your own image with OpenMPI "
            "and sshd set up as image/mpi/ sets ours up",
        )
    if spec.api == "rayjob":
        fail(
            spec,
            "image",
            "a RayJob's pods run `ray start`, and this image has no Ray: set image to our "
            f"image's Ray variant ({DEFAULT_IMAGE}-ray, or make image-local-ray: the ray extra), "
            "or to your own image with ray[default,train]",
        )


def _check_users_program_on_runtime(spec: TrainSpec) -> None:
    """What a user's program on an MPI or XGBoost runtime cannot have: staging on an MPI runtime
    would run in the launcher pod alone; an XGBoost runtime starts one worker per GPU."""
    policy = spec.runtime.policy
    if policy == "mpi" and spec.command is not None and spec.stage_data_uri:
        fail(
            spec,
            "stage_data_uri",
            "with your command on an MPI runtime only the launcher pod runs the command (the "
            "nodes run sshd), so the data would be staged there alone: leave stage_data_uri "
            "unset and have your program read the data where it runs (or stage it on every "
            "node first: trainer.mpirun's --first-on-each-node, in an image with our package)",
        )
    gpus = spec.gpus_per_worker
    if policy == "xgboost" and isinstance(gpus, int) and gpus > 1:
        fail(
            spec,
            "gpus_per_worker",
            f"on an XGBoost runtime the Trainer counts one XGBoost worker per GPU "
            f"(DMLC_NUM_WORKER = nodes x {gpus}) and starts one process per node, so the tracker "
            "would wait for workers that never come: set gpus_per_worker=1 and one node per GPU "
            "(workers), or use api=xgboostjob",
        )


MPI_RUNTIME_FOR_OUR_TRAINER = "kfp-ddp-mpi"
"""The ClusterTrainingRuntime we ship (``manifests/kfp-ddp-mpi-runtime.yaml``): an MPI runtime
whose node pods run sshd in our image's MPI variant (``image/build.sh local-mpi|release-mpi``)."""


def _check_ray_train_gpus(spec: TrainSpec) -> None:
    """Our trainer under Ray Train drives one GPU per Ray Train worker (nproc_per_node of them
    per pod): a pod's GPUs must be one per worker."""
    gpus = spec.gpus_per_worker
    if isinstance(gpus, int) and gpus and gpus != spec.nproc_per_node:
        fail(
            spec,
            "nproc_per_node",
            f"under Ray Train our trainer runs one worker per GPU: with gpus_per_worker={gpus} "
            f"set nproc_per_node={gpus} (Ray Train workers per pod)",
        )


def _check_mpi_implementation(spec: TrainSpec) -> None:
    """Our trainer starts under OpenMPI's mpirun (``trainer.mpirun`` reads its hostfile)."""
    options = spec.api_options
    chosen = getattr(options, "mpi_implementation", None)
    if chosen not in (None, "OpenMPI"):
        fail(
            options,
            "mpi_implementation",
            "our trainer starts under OpenMPI's mpirun (trainer.mpirun, in the image's MPI "
            "variant): leave it unset (OpenMPI), or give your own command for an image with "
            f"{chosen}",
        )


_NOT_OUR_TRAINER = {
    "mpi": (
        "it is one of Kubeflow Trainer's own MPI runtimes, whose node pods run sshd in the "
        "runtime's own image (only its launcher pod runs this spec's image), so our trainer "
        f"would not be on the nodes: install {MPI_RUNTIME_FOR_OUR_TRAINER!r} "
        "(manifests/kfp-ddp-mpi-runtime.yaml, with our image's MPI variant) and set "
        f"runtime_name={MPI_RUNTIME_FOR_OUR_TRAINER}, or train with the torch-distributed runtime "
        "(runtime_name unset), or give your program's command (in an image with OpenMPI; "
        "`python -m trainer.mpirun` starts a program on every slot of the runtime's hostfile)"
    ),
    "xgboost": (
        "it is an XGBoost runtime (the DMLC_* env of XGBoost's collective on every node), and "
        "our trainer is a PyTorch program: train with the torch-distributed runtime "
        "(runtime_name unset), or give your XGBoost program's image and command (see "
        "examples/xgboost)"
    ),
}
"""Runtime policies that cannot run our trainer → why, and what to do instead. An MPI runtime
can, when its node pods run our image (ours, or a cluster's own: pre-flight compares the
images); Kubeflow Trainer's own cannot."""


TRAINERS_OWN_MPI_RUNTIMES = ("deepspeed-distributed", "mlx-distributed")
"""Kubeflow Trainer's own MPI ClusterTrainingRuntimes: their node pods run their own images."""


def _check_runtime_policy(spec: TrainSpec) -> None:
    """What a TrainJob's runtime policy asks of the spec: our trainer under torchrun, or under
    mpirun on an MPI runtime that is not one of Kubeflow Trainer's own."""
    runtime = spec.runtime
    if spec.command is not None or runtime.policy not in _NOT_OUR_TRAINER:
        return
    trainers_own = runtime.runtime_kind in (None, "ClusterTrainingRuntime") and (
        runtime.runtime_name in TRAINERS_OWN_MPI_RUNTIMES
    )
    if runtime.policy == "mpi" and not trainers_own:
        return
    raise SpecError(
        f"TrainSpec.runtime_name={runtime.runtime_name!r} is invalid: "
        + _NOT_OUR_TRAINER[runtime.policy],
        field="runtime_name",
    )


USERS_PROGRAMS: dict[str, dict[str, str]] = {
    "tensorflow": {
        "image": "api=tfjob runs your TensorFlow program, and this default image holds our "
        "PyTorch trainer without TensorFlow: set image to one with TensorFlow and your code",
        "command": "api=tfjob needs your program's command, e.g. ['python', '/app/train.py'] (the "
        "default command runs our PyTorch trainer, which is no TensorFlow program)",
        "nproc_per_node": "a TFJob runs one TensorFlow process per pod "
        "(MultiWorkerMirroredStrategy uses every GPU of its pod): keep nproc_per_node=1 and set "
        "gpus_per_worker",
    },
    "xgboost": {
        "image": "an XGBoost job runs your XGBoost program, and this default image holds our "
        "PyTorch trainer without XGBoost: set image to one with xgboost and your code",
        "command": "an XGBoost job needs your program's command, e.g. ['python', "
        "'/app/train.py'] (the default command runs our PyTorch trainer)",
        "nproc_per_node": "an XGBoost job runs one worker per pod (XGBoost uses the pod's GPU): "
        "keep nproc_per_node=1",
    },
}
"""Framework → what a job of the user's own program says of each setting it needs."""


def _check_users_program(spec: TrainSpec) -> None:
    """A TensorFlow or XGBoost job runs the user's program: their image and command, one process
    per pod."""
    why = USERS_PROGRAMS[spec.framework]
    if spec.image == DEFAULT_IMAGE:
        fail(spec, "image", why["image"])
    if spec.command is None:
        fail(spec, "command", why["command"])
    if spec.nproc_per_node != 1:
        fail(spec, "nproc_per_node", why["nproc_per_node"])


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
