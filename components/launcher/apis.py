"""The cluster APIs a job can be launched with, described once: ``JobApi``.

Everything the backends need to know about an API beyond the manifest lives here: where it is
served (group, version, plural), how its pods are labelled and named, which container runs the
trainer, how its conditions say a job ended, and how to install it. The shared Kubernetes
backend code (pre-flight, log following, diagnosis, the wait loop) reads these instead of
branching on the kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.launcher import mpijob, pytorchjob, rayjob, tfjob, trainjob, xgboostjob
from components.launcher.names import PERMANENT_FAILURE
from components.launcher.spec import TrainSpec


@dataclass(frozen=True)
class JobPhase:
    """What a job's conditions say."""

    phase: str | None
    """``Succeeded``, ``Failed`` or None (still running)."""
    message: str = ""
    """The terminal condition's reason and message."""
    restarts: int = 0
    """Restarts the conditions report (PyTorchJob ``Restarting`` conditions)."""


@dataclass(frozen=True)
class ChildJobs:
    """The batch Jobs a controller makes for a job and finds again by name, not by owner (a
    JobSet's Jobs, KubeRay's submitter): a job of the same name created again while the old
    ones are still there (the garbage collector deletes them in the background) would take them
    for its own, a failed one failing it at once. Listing them needs ``list`` on batch Jobs."""

    selector: str
    """A label selector, ``{name}`` the job's name; a field selector when ``by_field``."""
    by_field: bool = False

    def query(self, name: str) -> dict[str, str]:
        """The keyword arguments of ``BatchV1Api.list_namespaced_job`` for job ``name``."""
        key = "field_selector" if self.by_field else "label_selector"
        return {key: self.selector.format(name=name)}


@dataclass(frozen=True)
class JobApi:
    """One training-job API (a CRD served by a Kubeflow controller)."""

    name: str
    """The ``TrainSpec.api`` value."""
    kind: str
    group: str
    version: str
    plural: str
    container: str
    """The container that runs the trainer in every pod."""
    pod_job_label: str
    """Pod label whose value is the job's name (selects the job's pods)."""
    replica_labels: tuple[str, str]
    """Pod labels (replica type, index) that name a pod's replica in the logs."""
    succeeded_condition: str
    """The condition type that means the job succeeded."""
    install: str
    """How to install the controller that serves the API."""
    build: Callable[[TrainSpec], dict[str, Any]]
    """The pure manifest builder."""
    suspend_patch: dict[str, Any]
    """The merge patch that suspends a job: its controller deletes its pods, the job stays."""
    child_jobs: ChildJobs | None = None
    """The batch Jobs to wait for before creating a job of the same name again (None: the
    controller makes none, or names them afresh)."""
    pods_exit_as_the_program: bool = True
    """Whether a pod's container exit is the program's (1-127: a permanent failure). Not a
    RayJob's: its pods run ``ray start`` and ``ray job logs``, which KubeRay restarts or retries;
    its program's code is in the RayJob's status (``program_exit_code``)."""

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}"

    def replica_of(self, pod: Any) -> str:
        """``master-0`` / ``worker-1`` / ``node-2`` from the controller's pod labels."""
        labels = pod.metadata.labels or {}
        rtype, index = (labels.get(key) for key in self.replica_labels)
        if rtype is not None and index is not None:
            return f"{rtype.lower()}-{index}"
        return pod.metadata.name

    def phase(self, job: dict[str, Any]) -> JobPhase:
        """The job's terminal phase (if any) from its conditions."""
        conditions = (job.get("status") or {}).get("conditions") or []
        restarting = sum(1 for c in conditions if c.get("type") == "Restarting")
        for cond in reversed(conditions):
            kind = cond.get("type")
            if cond.get("status") == "True" and kind in (self.succeeded_condition, "Failed"):
                message = f"{cond.get('reason') or ''}: {cond.get('message') or ''}".strip(": ")
                phase = "Succeeded" if kind == self.succeeded_condition else "Failed"
                return JobPhase(phase, message, restarting)
        return JobPhase(None, "", restarting)

    def program_exit_code(self, phase: JobPhase) -> int | None:
        """The program's exit code when only the job's status says it (None: read the pods)."""
        return None

    def retries(self, job: dict[str, Any]) -> tuple[int, str]:
        """How many times the controller ran the whole job again, and why the last attempt
        ended, as its status says (0: it says none)."""
        return 0, ""

    def permanent_code_before_retry(self, job: dict[str, Any]) -> int | None:
        """The permanent exit code (1-127) of a program that failed in a job its controller is
        about to run again whatever the code (None: nothing of the kind)."""
        return None

    def suspended(self, job: dict[str, Any]) -> bool:
        """Whether the job waits suspended (e.g. for Kueue admission)."""
        spec = job.get("spec") or {}
        return bool(spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"))

    @staticmethod
    def permanent_failure(job: dict[str, Any] | None) -> str | None:
        """Why the job failed for good, as a launcher recorded it (None: no such record)."""
        annotations = ((job or {}).get("metadata") or {}).get("annotations") or {}
        return annotations.get(PERMANENT_FAILURE)


def training_operator_api(
    name: str, kind: str, container: str, build: Callable[[TrainSpec], dict[str, Any]]
) -> JobApi:
    """A ``kubeflow.org/v1`` job of the Training Operator v1 (its pods labelled alike)."""
    return JobApi(
        name=name,
        kind=kind,
        group="kubeflow.org",
        version="v1",
        plural=f"{name}s",
        container=container,
        pod_job_label="training.kubeflow.org/job-name",
        replica_labels=(
            "training.kubeflow.org/replica-type",
            "training.kubeflow.org/replica-index",
        ),
        succeeded_condition="Succeeded",
        suspend_patch={"spec": {"runPolicy": {"suspend": True}}},
        install=(
            "install the Kubeflow Training Operator v1 (kubectl apply --server-side -k "
            '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0")'
        ),
        build=build,
    )


PYTORCHJOB = training_operator_api(
    "pytorchjob", pytorchjob.KIND, pytorchjob.CONTAINER_NAME, pytorchjob.build_pytorchjob
)
TFJOB = training_operator_api("tfjob", tfjob.KIND, tfjob.CONTAINER_NAME, tfjob.build_tfjob)
XGBOOSTJOB = training_operator_api(
    "xgboostjob", xgboostjob.KIND, xgboostjob.CONTAINER_NAME, xgboostjob.build_xgboostjob
)
TRAINJOB = JobApi(
    name="trainjob",
    kind=trainjob.KIND,
    group=trainjob.API_GROUP,
    version="v1alpha1",
    plural="trainjobs",
    container=trainjob.TRAINER_NODE,
    pod_job_label="jobset.sigs.k8s.io/jobset-name",
    # One Job per replicated job; its pods are the nodes, told apart by their completion index.
    replica_labels=(
        "jobset.sigs.k8s.io/replicatedjob-name",
        "batch.kubernetes.io/job-completion-index",
    ),
    succeeded_condition="Complete",
    suspend_patch={"spec": {"suspend": True}},
    install=(
        "install Kubeflow Trainer v2 with its runtimes (kubectl apply --server-side -k "
        '"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0" then -k '
        '"github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref=v2.3.0")'
    ),
    build=trainjob.build_trainjob,
    child_jobs=ChildJobs("jobset.sigs.k8s.io/jobset-name={name}"),
)


@dataclass(frozen=True)
class RayJobApi(JobApi):
    """A KubeRay RayJob: no conditions but ``jobDeploymentStatus`` and the Ray job's
    ``jobStatus``; its pods are a head, workers and the submitter."""

    TERMINAL_FAILURES = ("Failed", "ValidationFailed")

    def replica_of(self, pod: Any) -> str:
        """``head-0`` / ``worker-<replica index>`` / ``submitter``."""
        labels = pod.metadata.labels or {}
        node_type = labels.get("ray.io/node-type")
        if node_type == "head":
            return "head-0"
        if node_type == "worker":
            return f"worker-{labels.get('ray.io/worker-group-replica-index', pod.metadata.name)}"
        if labels.get("batch.kubernetes.io/job-name") or labels.get("job-name"):
            return "submitter"
        return pod.metadata.name

    def program_exit_code(self, phase: JobPhase) -> int | None:
        """The entrypoint's exit code, from Ray's message in the RayJob's status (``Job
        entrypoint command failed with exit code 2, ...``): the driver runs on the head, in no
        pod of its own, and the submitter pod's exit code is ``ray job logs``'."""
        found = re.search(r"entrypoint command failed with exit code (\d+)", phase.message)
        return int(found.group(1)) if found else None

    def retries(self, job: dict[str, Any]) -> tuple[int, str]:
        """KubeRay's retries (``status.failed``: each a new Ray cluster, up to ``backoffLimit``)
        and the first line of the Ray job's message (``Job entrypoint command failed with exit
        code 143, ...``), kept until the retry's cluster is up."""
        status = job.get("status") or {}
        message = (status.get("message") or "").split("\n", 1)[0]
        message = message.split(", last available logs", 1)[0].rstrip(" :,")
        return int(status.get("failed") or 0), message

    def permanent_code_before_retry(self, job: dict[str, Any]) -> int | None:
        """With ``backoffLimit`` left, KubeRay retries a failed Ray job in a new Ray cluster
        whatever its code: a bad flag would allocate every GPU again. Its status says the Ray job
        FAILED, with the entrypoint's code, seconds before the deployment fails (KubeRay first
        waits for the submitter) and goes straight on to ``Retrying``: that code, while a retry
        is to come, when it is permanent (1-127)."""
        status = job.get("status") or {}
        if status.get("jobStatus") != "FAILED" or status.get("jobDeploymentStatus") not in (
            "Running",
            "Retrying",
        ):
            return None
        backoff = int((job.get("spec") or {}).get("backoffLimit") or 0)
        failed = int(status.get("failed") or 0)
        retry_to_come = failed < backoff or status.get("jobDeploymentStatus") == "Retrying"
        code = self.program_exit_code(JobPhase(None, status.get("message") or ""))
        return code if retry_to_come and code is not None and 0 < code < 128 else None

    def phase(self, job: dict[str, Any]) -> JobPhase:
        """Succeeded once the deployment is Complete with the Ray job SUCCEEDED; Failed when it
        failed (or completed with the Ray job FAILED or STOPPED)."""
        status = job.get("status") or {}
        deployment = status.get("jobDeploymentStatus")
        ray_status = status.get("jobStatus")
        said = ": ".join(x for x in (status.get("reason"), status.get("message")) if x)
        if deployment == "Complete":
            if ray_status == "SUCCEEDED":
                return JobPhase("Succeeded", said)
            return JobPhase("Failed", said or f"the Ray job ended {ray_status}")
        if deployment in self.TERMINAL_FAILURES:
            where = f"jobDeploymentStatus {deployment}, Ray job {ray_status or 'not started'}"
            return JobPhase("Failed", f"{said} ({where})" if said else where)
        return JobPhase(None, "")


@dataclass(frozen=True)
class MPIJobApi(JobApi):
    """An MPI Operator v2 MPIJob: its pods say their role (launcher, worker) and a worker its
    index."""

    def replica_of(self, pod: Any) -> str:
        """``launcher`` / ``worker-<index>``."""
        labels = pod.metadata.labels or {}
        role, index = (labels.get(key) for key in self.replica_labels)
        if role == "launcher":
            return "launcher"
        return f"worker-{index}" if role == "worker" and index is not None else pod.metadata.name


MPIJOB = MPIJobApi(
    name="mpijob",
    kind=mpijob.KIND,
    group=mpijob.API_GROUP,
    version="v2beta1",
    plural="mpijobs",
    container=mpijob.CONTAINER,
    pod_job_label="training.kubeflow.org/job-name",
    replica_labels=("training.kubeflow.org/job-role", "training.kubeflow.org/replica-index"),
    succeeded_condition="Succeeded",
    suspend_patch={"spec": {"runPolicy": {"suspend": True}}},
    install=(
        "install the MPI Operator v0.8 (kubectl apply --server-side -f https://raw."
        "githubusercontent.com/kubeflow/mpi-operator/v0.8.0/deploy/v2beta1/mpi-operator.yaml)"
    ),
    build=mpijob.build_mpijob,
    child_jobs=ChildJobs("metadata.name={name}-launcher", by_field=True),  # the launcher Job
)
RAYJOB = RayJobApi(
    name="rayjob",
    kind=rayjob.KIND,
    group=rayjob.API_GROUP,
    version="v1",
    plural="rayjobs",
    container=rayjob.CONTAINER,
    pod_job_label=rayjob.JOB_LABEL,
    replica_labels=("ray.io/node-type", "ray.io/worker-group-replica-index"),
    succeeded_condition="Complete",
    suspend_patch={"spec": {"suspend": True}},
    install=(
        "install the KubeRay operator v1.x (helm install kuberay-operator "
        "kuberay/kuberay-operator --version 1.7.0, from https://ray-project.github.io/kuberay-helm/)"
    ),
    build=rayjob.build_rayjob,
    child_jobs=ChildJobs("metadata.name={name}", by_field=True),  # the submitter
    pods_exit_as_the_program=False,
)
JOB_APIS: dict[str, JobApi] = {
    api.name: api for api in (TRAINJOB, PYTORCHJOB, TFJOB, XGBOOSTJOB, RAYJOB, MPIJOB)
}
"""Every concrete API (cleanup and RBAC cover them all)."""
AUTO_APIS: tuple[JobApi, ...] = (TRAINJOB, PYTORCHJOB)
"""What ``api="auto"`` chooses from, in its order of preference: the APIs that run our PyTorch
trainer. Never a TFJob, which runs a TensorFlow program and is always asked for by name."""


def job_api(name: str) -> JobApi:
    """The ``JobApi`` of a concrete API name."""
    try:
        return JOB_APIS[name]
    except KeyError:
        raise ValueError(
            f"api={name!r} is not a concrete API; use one of {', '.join(JOB_APIS)}"
        ) from None


def build_manifest(spec: TrainSpec) -> dict[str, Any]:
    """The manifest of ``spec`` for its API (``auto`` renders a TrainJob, Kubeflow's current)."""
    return job_api(spec.api if spec.api != "auto" else TRAINJOB.name).build(spec)
