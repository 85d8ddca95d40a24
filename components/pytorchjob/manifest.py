"""``build_pytorchjob(spec)``: the PyTorchJob manifest of a TrainSpec, built by pure functions.

Built with kubeflow-training's models and the kubernetes client's pod models, serialised with the
client's own ``sanitize_for_serialization``, so field names and nesting come from the generated
API types rather than hand-written dicts. ``admission_errors`` re-states the Training Operator's
validating-webhook rules so a manifest is checked before it ever reaches a cluster.
"""

from __future__ import annotations

from typing import Any

from kubeflow.training import models as ktm
from kubernetes import client as k8s

from components.pytorchjob.spec import (
    CLEAN_POD_POLICIES,
    DNS1035,
    KUEUE_QUEUE_LABEL,
    RESTART_POLICIES,
    RUN_ID_LABEL,
    TASK_LABEL,
    TrainSpec,
    label_safe,
)

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"
"""The operator finds its container (and injects the PET_* env) by this name."""
SHM_VOLUME = "dshm"


class ManifestError(ValueError):
    """A manifest breaks one of the Training Operator's admission rules."""


def job_labels(spec: TrainSpec) -> dict[str, str]:
    """Labels on the job (and its pods): user labels, run id, task, Kueue queue."""
    labels = dict(spec.labels)
    labels[RUN_ID_LABEL] = label_safe(spec.run_id) if spec.run_id else "none"
    labels[TASK_LABEL] = label_safe(spec.task_name) if spec.task_name else "none"
    if spec.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = spec.kueue_queue
    return labels


def _resources(spec: TrainSpec) -> k8s.V1ResourceRequirements | None:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.cpu_request:
        requests["cpu"] = spec.cpu_request
    if spec.memory_request:
        requests["memory"] = spec.memory_request
    if spec.cpu_limit:
        limits["cpu"] = spec.cpu_limit
    if spec.memory_limit:
        limits["memory"] = spec.memory_limit
    if spec.gpus_per_worker:
        # Extended resources: a limit alone is enough (the request defaults to it).
        limits[spec.gpu_resource] = str(spec.gpus_per_worker)
    if not requests and not limits:
        return None
    return k8s.V1ResourceRequirements(requests=requests or None, limits=limits or None)


def _volumes(spec: TrainSpec) -> tuple[list[k8s.V1Volume], list[k8s.V1VolumeMount]]:
    volumes: list[k8s.V1Volume] = []
    mounts: list[k8s.V1VolumeMount] = []
    if spec.shm_size:
        volumes.append(
            k8s.V1Volume(
                name=SHM_VOLUME,
                empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=spec.shm_size),
            )
        )
        mounts.append(k8s.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm"))
    for i, pvc in enumerate(spec.pvcs):
        name = f"pvc-{i}"
        volumes.append(
            k8s.V1Volume(
                name=name,
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                    claim_name=pvc.claim, read_only=pvc.read_only or None
                ),
            )
        )
        mounts.append(
            k8s.V1VolumeMount(name=name, mount_path=pvc.path, read_only=pvc.read_only or None)
        )
    return volumes, mounts


def _tolerations(spec: TrainSpec) -> list[k8s.V1Toleration] | None:
    return [
        k8s.V1Toleration(
            key=t.get("key"),
            operator=t.get("operator"),
            value=t.get("value"),
            effect=t.get("effect"),
            toleration_seconds=t.get("toleration_seconds"),
        )
        for t in spec.tolerations
    ] or None


def build_pod_template(spec: TrainSpec) -> k8s.V1PodTemplateSpec:
    """The pod template every replica uses (Master and Workers differ only in replica type)."""
    volumes, mounts = _volumes(spec)
    container = k8s.V1Container(
        name=CONTAINER_NAME,
        image=spec.image,
        command=spec.container_command(),
        args=list(spec.args) or None,
        env=[k8s.V1EnvVar(name=k, value=v) for k, v in spec.merged_env().items()] or None,
        resources=_resources(spec),
        volume_mounts=mounts or None,
    )
    pod_spec = k8s.V1PodSpec(
        containers=[container],
        volumes=volumes or None,
        host_network=spec.host_network or None,
        dns_policy="ClusterFirstWithHostNet" if spec.host_network else None,
        node_selector=dict(spec.node_selector) or None,
        tolerations=_tolerations(spec),
        service_account_name=spec.service_account,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in spec.image_pull_secrets]
        or None,
        scheduler_name=spec.scheduler_name,
        termination_grace_period_seconds=spec.termination_grace_period_seconds,
    )
    metadata = k8s.V1ObjectMeta(labels=job_labels(spec), annotations=dict(spec.annotations) or None)
    return k8s.V1PodTemplateSpec(metadata=metadata, spec=pod_spec)


def _run_policy(spec: TrainSpec) -> ktm.KubeflowOrgV1RunPolicy:
    scheduling = None
    if spec.scheduler_name or spec.queue or spec.priority_class or spec.min_available:
        scheduling = ktm.KubeflowOrgV1SchedulingPolicy(
            # Gang scheduling: every pod or none, so a half-placed job never holds GPUs idle.
            min_available=spec.min_available
            or (spec.elastic_min_replicas if spec.elastic else spec.workers),
            queue=spec.queue,
            priority_class=spec.priority_class,
        )
    return ktm.KubeflowOrgV1RunPolicy(
        backoff_limit=spec.backoff_limit,
        active_deadline_seconds=spec.active_deadline_seconds,
        clean_pod_policy=spec.clean_pod_policy,
        ttl_seconds_after_finished=spec.ttl_seconds_after_finished,
        scheduling_policy=scheduling,
    )


def build_pytorchjob_model(spec: TrainSpec) -> ktm.KubeflowOrgV1PyTorchJob:
    """The job as kubeflow-training's ``KubeflowOrgV1PyTorchJob`` (what TrainingClient takes)."""
    template = build_pod_template(spec)
    replica_specs = {
        rtype: ktm.KubeflowOrgV1ReplicaSpec(
            replicas=count, restart_policy=spec.restart_policy, template=template
        )
        for rtype, count in spec.replica_counts().items()
    }
    elastic = None
    if spec.elastic:
        elastic = ktm.KubeflowOrgV1ElasticPolicy(
            min_replicas=spec.elastic_min_replicas,
            max_replicas=spec.elastic_max_replicas,
            max_restarts=spec.max_restarts,
            rdzv_backend="c10d",
        )
    return ktm.KubeflowOrgV1PyTorchJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=k8s.V1ObjectMeta(
            name=spec.name,
            namespace=spec.namespace,
            labels=job_labels(spec),
            annotations=dict(spec.annotations) or None,
        ),
        spec=ktm.KubeflowOrgV1PyTorchJobSpec(
            pytorch_replica_specs=replica_specs,
            # Only here, never also in elasticPolicy.nProcPerNode (the webhook refuses both).
            nproc_per_node=str(spec.nproc_per_node),
            elastic_policy=elastic,
            run_policy=_run_policy(spec),
        ),
    )


def build_pytorchjob(spec: TrainSpec) -> dict[str, Any]:
    """The PyTorchJob manifest of ``spec`` as a plain dict (pure; touches no cluster)."""
    manifest = k8s.ApiClient().sanitize_for_serialization(build_pytorchjob_model(spec))
    errors = admission_errors(manifest)
    if errors:  # A bug in this module, not in the spec: TrainSpec already refused bad values.
        raise ManifestError("; ".join(errors))
    return manifest


def admission_errors(manifest: dict[str, Any]) -> list[str]:
    """The Training Operator v1 validating-webhook rules ``manifest`` breaks (empty: none).

    DNS-1035 name; replica types Master/Worker only; each with containers, one named ``pytorch``
    and every image set; Master replicas exactly 1, other replicas >= 1; an elastic policy needs a
    Worker and must not set nProcPerNode together with spec.nprocPerNode; run policy numbers
    non-negative. Also the enums the CRD schema leaves open (restartPolicy, cleanPodPolicy).
    """
    errors: list[str] = []
    name = (manifest.get("metadata") or {}).get("name") or ""
    if len(name) > 63 or not DNS1035.match(name):
        errors.append(f"metadata.name {name!r}: must be a DNS-1035 label")
    spec = manifest.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs")
    if not replicas:
        errors.append("spec.pytorchReplicaSpecs: must be set")
        replicas = {}
    for rtype, rspec in replicas.items():
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in ("Master", "Worker"):
            errors.append(f"{path}: replica type must be Master or Worker")
        rspec = rspec or {}
        containers = ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            errors.append(f"{path}.template.spec.containers: must be specified")
        if containers and not any(c.get("name") == CONTAINER_NAME for c in containers):
            errors.append(f"{path}: needs a container named {CONTAINER_NAME!r}")
        for i, c in enumerate(containers):
            if not c.get("image"):
                errors.append(f"{path}.template.spec.containers[{i}].image: must be set")
        count = rspec.get("replicas")
        if rtype == "Master" and count != 1:
            errors.append(f"{path}.replicas: must be 1 (got {count})")
        elif rtype != "Master" and count is not None and count < 1:
            errors.append(f"{path}.replicas: must be at least 1 (got {count})")
        policy = rspec.get("restartPolicy")
        if policy is not None and policy not in RESTART_POLICIES:
            errors.append(f"{path}.restartPolicy {policy!r}: allowed {RESTART_POLICIES}")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "Worker" not in replicas:
            errors.append("spec.pytorchReplicaSpecs[Worker]: must be configured with elasticPolicy")
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            errors.append("spec.elasticPolicy.nProcPerNode: must not be used with nprocPerNode")
    run_policy = spec.get("runPolicy") or {}
    for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if run_policy.get(key) is not None and run_policy[key] < 0:
            errors.append(f"spec.runPolicy.{key}: must be non-negative")
    clean = run_policy.get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        errors.append(f"spec.runPolicy.cleanPodPolicy {clean!r}: allowed {CLEAN_POD_POLICIES}")
    return errors
