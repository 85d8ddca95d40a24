"""Pod pieces every API's manifest shares: resources (CPU, memory, GPUs, disk), volumes
(/dev/shm, the scratch folders /tmp and HOME, the staging volume and PVCs), tolerations, the
staging init container.

Built once, with the ``kubernetes`` client's models; the PyTorchJob builder puts them into its pod
template, the TrainJob builder into ``resourcesPerNode`` and its runtime patch.
"""

from __future__ import annotations

import math
from typing import Any

from kubernetes import client as k8s

from components.launcher import pod_security
from components.launcher.spec import (
    SCRATCH_DIRS,
    SCRATCH_ENV,
    STAGE_CACHE,
    STAGE_ROOT,
    STAGE_SYNC_CACHE,
    TrainSpec,
)
from components.s3_sync.hash_cache import CACHE_ENV
from trainer.cpu_request import CPU_REQUEST_ENV, NODE_CPU_REQUEST_ENV

SHM_VOLUME = "dshm"
STAGE_VOLUME = "staged-data"
CACHE_VOLUME = "stage-cache"
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def resources(spec: TrainSpec) -> k8s.V1ResourceRequirements | None:
    """CPU/memory requests and limits, the GPUs as an extended-resource limit, and the pod's
    node-local disk (ephemeral-storage request = limit: bounded, see ``sizing``)."""
    requests = {k: v for k, v in (("cpu", spec.cpu_request), ("memory", spec.memory_request)) if v}
    limits = {k: v for k, v in (("cpu", spec.cpu_limit), ("memory", spec.memory_limit)) if v}
    requests["ephemeral-storage"] = limits["ephemeral-storage"] = spec.disk()
    if spec.gpus_per_worker:
        # Extended resources: a limit alone is enough (the request defaults to it).
        limits[spec.gpu_resource] = str(spec.gpus_per_worker)
    if spec.rdma and spec.rdma_resource:
        limits[spec.rdma_resource] = "1"
    if not requests and not limits:
        return None
    return k8s.V1ResourceRequirements(requests=requests or None, limits=limits or None)


def volumes(spec: TrainSpec) -> tuple[list[k8s.V1Volume], list[k8s.V1VolumeMount]]:
    """The memory-backed /dev/shm, the scratch folders, the staging volume and the PVCs, with
    their mounts in the training container, then ``pod_extras``' volumes and mounts (Kubernetes
    JSON, serialised as they are)."""
    found: list[k8s.V1Volume] = []
    mounts: list[k8s.V1VolumeMount] = []
    if spec.shm_size:
        found.append(
            k8s.V1Volume(
                name=SHM_VOLUME,
                empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=spec.shm_size),
            )
        )
        mounts.append(k8s.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm"))
    found += scratch_volumes()
    mounts += scratch_mounts()
    if spec.stage_data_uri:
        found += stage_volumes(spec)
        mounts += stage_mounts(spec)
    for i, pvc in enumerate(spec.pvcs):
        name = f"pvc-{i}"
        found.append(
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
    extras = spec.extras
    return found + extras.volumes, mounts + extras.volume_mounts


def scratch_volumes() -> list[k8s.V1Volume]:
    """The emptyDirs of /tmp and HOME, bounded (their sizes count in the pod's disk, ``sizing``):
    every container's root file system is read-only."""
    return [
        k8s.V1Volume(
            name=scratch.volume,
            empty_dir=k8s.V1EmptyDirVolumeSource(size_limit=f"{scratch.size_gi}Gi"),
        )
        for scratch in SCRATCH_DIRS
    ]


def scratch_mounts() -> list[k8s.V1VolumeMount]:
    return [k8s.V1VolumeMount(name=d.volume, mount_path=d.path) for d in SCRATCH_DIRS]


def tolerations(spec: TrainSpec) -> list[k8s.V1Toleration] | None:
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


def stage_volumes(spec: TrainSpec) -> list[k8s.V1Volume]:
    """The node's own disk for staged data, checkpoints and outputs: an emptyDir bounded by
    ``stage_volume_size``; with an admin's hostPath cache, the data sets live there instead
    (kept between pods, bounded by the stager's eviction) and the emptyDir keeps the rest, so
    that jobs sharing a node never share a link, a checkpoint or an output."""
    found = [
        k8s.V1Volume(
            name=STAGE_VOLUME,
            empty_dir=k8s.V1EmptyDirVolumeSource(size_limit=spec.stage_volume_size()),
        )
    ]
    if spec.stage_cache_host_path:
        found.append(
            k8s.V1Volume(
                name=CACHE_VOLUME,
                host_path=k8s.V1HostPathVolumeSource(
                    path=spec.stage_cache_host_path, type="DirectoryOrCreate"
                ),
            )
        )
    return found


def stage_mounts(spec: TrainSpec) -> list[k8s.V1VolumeMount]:
    mounts = [k8s.V1VolumeMount(name=STAGE_VOLUME, mount_path=STAGE_ROOT)]
    if spec.stage_cache_host_path:
        mounts.append(k8s.V1VolumeMount(name=CACHE_VOLUME, mount_path=STAGE_CACHE))
    return mounts


def s3_env(spec: TrainSpec) -> list[k8s.V1EnvVar]:
    """The endpoint as a value, the keys as references to the Secret (never their values)."""
    found = []
    if spec.s3_endpoint:
        found.append(k8s.V1EnvVar(name="AWS_ENDPOINT_URL_S3", value=spec.s3_endpoint))
    if spec.s3_credentials_secret:
        found += [
            k8s.V1EnvVar(
                name=key,
                value_from=k8s.V1EnvVarSource(
                    secret_key_ref=k8s.V1SecretKeySelector(name=spec.s3_credentials_secret, key=key)
                ),
            )
            for key in S3_SECRET_KEYS
        ]
    return found


def container_env(spec: TrainSpec, *, given: dict[str, str] | None = None) -> list[k8s.V1EnvVar]:
    """What every container we render gets, unless ``given`` (the container's other values) has
    it: HOME and TMPDIR on the scratch emptyDirs (``SCRATCH_ENV``, whatever the image says) and,
    when the pod stages data, the stager's hash cache on the staging volume (one entry per file
    of the data set: it grows with it)."""
    values = dict(SCRATCH_ENV)
    if spec.stage_data_uri:
        values[CACHE_ENV] = STAGE_SYNC_CACHE
    return [k8s.V1EnvVar(name=k, value=v) for k, v in values.items() if k not in (given or {})]


def cpu_request_env(given: dict[str, str]) -> list[k8s.V1EnvVar]:
    """``CPU_REQUEST_ENV``: the container's CPU request in whole CPUs, rounded up (the Downward
    API), which the trainer keeps its compute threads within — a pod without a CPU limit sees
    every core of its node. Not when ``given`` sets it."""
    if CPU_REQUEST_ENV in given:
        return []
    source = k8s.V1ResourceFieldSelector(resource="requests.cpu", divisor="1")
    return [
        k8s.V1EnvVar(name=CPU_REQUEST_ENV, value_from=k8s.V1EnvVarSource(resource_field_ref=source))
    ]


def node_cpu_request_env(spec: TrainSpec, given: dict[str, str]) -> list[k8s.V1EnvVar]:
    """``NODE_CPU_REQUEST_ENV`` for our trainer under mpirun: the node pods' CPU request in whole
    CPUs, rounded up as the Downward API rounds it (a request defaults to the limit), which
    ``trainer.mpirun`` hands to the ranks it starts over SSH; they see nothing of their pod's
    environment, and would take every core of their node. Not when ``given`` sets it, nor
    without a CPU request or limit."""
    cpu = spec.cpu_request or spec.cpu_limit
    if not spec.mpi_trainer or NODE_CPU_REQUEST_ENV in given or not cpu:
        return []
    from kubernetes.utils import parse_quantity

    whole = max(1, math.ceil(parse_quantity(cpu)))
    return [k8s.V1EnvVar(name=NODE_CPU_REQUEST_ENV, value=str(whole))]


def env_vars(spec: TrainSpec) -> list[k8s.V1EnvVar]:
    """The training container's: ``container_env``, the plain values (which win), the CPU
    request (and the nodes', under mpirun), the S3 settings, then ``pod_extras``' references
    (Kubernetes JSON)."""
    plain = spec.merged_env()
    plain_env = [k8s.V1EnvVar(name=k, value=v) for k, v in plain.items()]
    own = container_env(spec, given=plain) + plain_env + cpu_request_env(plain)
    own += node_cpu_request_env(spec, plain)
    return own + s3_env(spec) + spec.extras.env


def stage_init_container(spec: TrainSpec) -> k8s.V1Container | None:
    """The init container that stages the data on the node (PyTorchJob; None without)."""
    if not spec.stage_data_uri:
        return None
    return k8s.V1Container(
        name="stage-data",
        image=spec.image,
        command=spec.stage_command(),
        env=container_env(spec) + s3_env(spec),
        volume_mounts=scratch_mounts() + stage_mounts(spec),
        security_context=pod_security.container_context(spec, training=False),
    )


def plain(model: Any) -> Any:
    """A kubernetes-client model (or a list/dict of them) as plain API JSON."""
    return k8s.ApiClient().sanitize_for_serialization(model)
