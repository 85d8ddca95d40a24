"""Kubernetes naming rules and the labels every job of ours carries.

One place for the DNS name and label grammars, the run-scoped job name (a retried KFP step finds
the job its first attempt created) and the labels cleanup and re-attach select on.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

RUN_ID_LABEL = "kfp-ddp.io/run-id"
"""Label on every job and its pods: the KFP run id (cleanup and re-attach select on it)."""
TASK_LABEL = "kfp-ddp.io/task"
"""Label on every job and its pods: the KFP task name that launched it."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ISTIO_INJECT = "sidecar.istio.io/inject"
PERMANENT_FAILURE = "kfp-ddp.io/permanent-failure"
"""Annotation on a job that failed for good (a program exit 1-127): why. A retried step finds
it and fails at once instead of allocating the GPUs again."""
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
SERVICE_ACCOUNT_NS_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


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
        base = f"job-{base}".rstrip("-")
    digest = hashlib.sha256(f"{run_id}/{task_name}".encode()).hexdigest()[:10]
    return f"{base}-{digest}"


def label_safe(value: str) -> str:
    """``value`` if it is a valid label value, else a stable 63-character-or-less digest of it."""
    if len(value) <= 63 and LABEL_VALUE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def qualified_name_ok(key: str) -> bool:
    """Whether ``key`` is a valid label/annotation key (``[prefix/]name``)."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))


def run_labels(run_id: str, task_name: str) -> dict[str, str]:
    """The run-scoped labels (run id and task), label-safe."""
    return {
        RUN_ID_LABEL: label_safe(run_id) if run_id else "none",
        TASK_LABEL: label_safe(task_name) if task_name else "none",
    }


@dataclass(frozen=True)
class ControllerEnv:
    """The variables a job's controller gives every pod: set in ``env`` too, they would clash
    (the Trainer's webhook refuses a TrainJob that sets its own)."""

    owner: str
    names: tuple[str, ...] = ()
    prefix: str = ""
    """Every name that starts with it (``PET_``), besides ``names``."""

    def taken(self, names: Iterable[str]) -> list[str]:
        """Which of ``names`` the controller sets, sorted."""
        return sorted(
            n for n in names if n in self.names or (self.prefix and n.startswith(self.prefix))
        )


TRAINER_XGBOOST_ENV = ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER")
"""What Kubeflow Trainer's XGBoost runtime gives every node."""
TRAINER_MPI_ENV = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
)
"""What Kubeflow Trainer's MPI plugin gives a TrainJob's pods (OpenMPI's hostfile and ssh
arguments)."""
OPERATOR_XGBOOST_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "WORKER_ADDRS",
    "WORKER_PORT",
)
"""What the Training Operator gives every XGBoostJob replica."""


KUBERAY_ENV = (
    "RAY_ADDRESS",
    "RAY_IP",
    "FQ_RAY_IP",
    "RAY_PORT",
    "RAY_CLUSTER_NAME",
    "RAY_CLUSTER_NAMESPACE",
    "RAY_DASHBOARD_ADDRESS",
    "RAY_JOB_SUBMISSION_ID",
    "KUBERAY_GEN_RAY_START_CMD",
)
"""What the KubeRay operator gives a RayJob's pods (the Ray cluster's address, its command)."""


MPI_OPERATOR_ENV = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
    "K_MPI_JOB_ROLE",
)
"""What the MPI Operator v0.8 gives an MPIJob's pods (OpenMPI's hostfile and ssh arguments on the
launcher, every pod's role)."""


def controller_env(api: str, ml_policy: str | None) -> ControllerEnv | None:
    """What the controller of ``api`` (a TrainJob: on a runtime of ``ml_policy``) sets in every
    pod (None: nothing we know of, or ``auto``, not yet decided)."""
    if api == "trainjob":
        names = {"xgboost": TRAINER_XGBOOST_ENV, "mpi": TRAINER_MPI_ENV}.get(ml_policy or "", ())
        return ControllerEnv("the Trainer controller", names, prefix="PET_")
    if api == "tfjob":
        return ControllerEnv("the Training Operator", ("TF_CONFIG",))
    if api == "xgboostjob":  # DMLC_*: the pod's command sets them from the operator's
        return ControllerEnv("the Training Operator", OPERATOR_XGBOOST_ENV + TRAINER_XGBOOST_ENV)
    if api == "rayjob":
        return ControllerEnv("the KubeRay operator", KUBERAY_ENV)
    if api == "mpijob":
        return ControllerEnv("the MPI Operator", MPI_OPERATOR_ENV)
    return None
