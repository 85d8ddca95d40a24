"""``build_trainjob(spec)``: the Kubeflow Trainer v2 TrainJob of a TrainSpec (pure).

Built from the typed Trainer v2 models (``kubeflow-trainer-api``), whose runtime-patch models
allow only the pod fields the Trainer API lets a TrainJob patch, and serialised with their own
``to_dict``. The mapping:

- ``runtimeRef``: ``runtime_kind``/``runtime_name`` (default: the ClusterTrainingRuntime
  ``torch-distributed``, which runs the node container with the ``PET_*`` env for torchrun; on an
  MPI runtime the launcher pod is patched like the nodes; on ``xgboost-distributed`` every node
  gets XGBoost's ``DMLC_*`` env from the controller);
- ``trainer``: image, command, args, env (the NCCL preset and ``env``; never ``PET_*``, the
  controller owns them), ``numNodes`` = workers, ``numProcPerNode``, ``resourcesPerNode`` (GPUs as
  an extended-resource limit, CPU, memory);
- ``runtimePatches`` (manager ``kfp-ddp.io/launcher``) for what a TrainJob has no field for:
  the pods' labels and annotations (the Istio opt-out), service account, node selector,
  affinity, tolerations, image pull secrets, termination grace period, the pod's and the ``node``
  container's securityContext (``pod_security``; a read-only root file system), the ``/dev/shm``
  emptyDir, the ``/tmp`` and HOME emptyDirs, the staging volume and PVC volumes with their
  mounts in the ``node`` container, ``pod_extras``' volumes and mounts;
- the run-scoped labels and the Kueue queue label on the TrainJob (queued jobs start suspended,
  Kueue admits them), ``activeDeadlineSeconds``.

What a TrainJob cannot express (elastic policy, gang scheduling, priority class, host network,
v1 restart/cleanup policies) is refused by ``TrainSpec`` for ``api="trainjob"``.
"""

from __future__ import annotations

import shlex
from typing import Any

from kubeflow_trainer_api import models as tm

from components.launcher import monitoring, pod_parts, pod_security
from components.launcher.spec import MPI_FIRST_ON_EACH_NODE, MPI_TRAINER, TrainSpec

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
DEFAULT_RUNTIME_KIND = "ClusterTrainingRuntime"
TRAINER_NODE = "node"
"""The runtime's replicated job (and container) that runs the trainer on every node."""
MPI_LAUNCHER = "launcher"
"""An MPI runtime's replicated job whose pod runs the TrainJob's image and command (mpirun);
its container is named ``node`` too."""
PATCH_MANAGER = "kfp-ddp.io/launcher"


def _trainer(spec: TrainSpec) -> tm.TrainerV1alpha1Trainer:
    resources = pod_parts.resources(spec)
    env = pod_parts.env_vars(spec)
    return tm.TrainerV1alpha1Trainer(
        image=spec.image,
        command=_command(spec),
        args=spec.container_args() or None,
        env=[tm.IoK8sApiCoreV1EnvVar.from_dict(e) for e in pod_parts.plain(env)],
        numNodes=spec.workers,
        # An XGBoost runtime derives its workers per node from the GPUs and ignores this.
        numProcPerNode=None if spec.runtime.is_xgboost else spec.nproc_per_node,
        resourcesPerNode=tm.IoK8sApiCoreV1ResourceRequirements.from_dict(pod_parts.plain(resources))
        if resources
        else None,
    )


def _command(spec: TrainSpec) -> list[str]:
    """The trainer's command. A TrainJob cannot add an init container (runtime patches only patch
    the runtime's own), so a node stages its data in the same container, then execs the training
    command. On an MPI runtime the node pods run sshd alone: mpirun stages the data on each of
    them (the launcher too, when it is a node) before starting our trainer."""
    staging = spec.stage_command()
    if not staging:
        return spec.container_command()
    if spec.mpi_trainer:
        return [*MPI_TRAINER, MPI_FIRST_ON_EACH_NODE, shlex.join(staging), "-m", "trainer.train"]
    return [*staging, "--", *spec.container_command()]


def _pod_spec_patch(spec: TrainSpec) -> tm.TrainerV1alpha1PodSpecPatch:
    volumes, mounts = pod_parts.volumes(spec)
    tolerations = pod_parts.tolerations(spec)
    security = pod_security.container_context(spec)
    pod_context = pod_security.pod_context(spec)
    container = None
    if mounts or security:
        container = tm.TrainerV1alpha1ContainerPatch(
            name=TRAINER_NODE,
            volumeMounts=[
                tm.IoK8sApiCoreV1VolumeMount.from_dict(m) for m in pod_parts.plain(mounts)
            ]
            or None,
            securityContext=tm.IoK8sApiCoreV1SecurityContext.from_dict(pod_parts.plain(security))
            if security
            else None,
        )
    return tm.TrainerV1alpha1PodSpecPatch(
        containers=[container] if container else None,
        volumes=[tm.IoK8sApiCoreV1Volume.from_dict(v) for v in pod_parts.plain(volumes)] or None,
        nodeSelector=dict(spec.node_selector) or None,
        affinity=tm.IoK8sApiCoreV1Affinity.from_dict(spec.extras.affinity)
        if spec.extras.affinity
        else None,
        tolerations=[tm.IoK8sApiCoreV1Toleration.from_dict(t) for t in pod_parts.plain(tolerations)]
        if tolerations
        else None,
        securityContext=tm.IoK8sApiCoreV1PodSecurityContext.from_dict(pod_parts.plain(pod_context))
        if pod_context
        else None,
        serviceAccountName=spec.service_account,
        imagePullSecrets=[
            tm.IoK8sApiCoreV1LocalObjectReference(name=s) for s in spec.image_pull_secrets
        ]
        or None,
        terminationGracePeriodSeconds=spec.termination_grace_period_seconds,
    )


def _runtime_patch(spec: TrainSpec) -> tm.TrainerV1alpha1RuntimePatch:
    pod = tm.TrainerV1alpha1PodTemplatePatch(
        metadata=tm.IoK8sApimachineryPkgApisMetaV1ObjectMeta(
            labels=spec.job_labels(), annotations=monitoring.pod_annotations(spec)
        ),
        spec=_pod_spec_patch(spec),
    )
    # An MPI runtime's launcher pod is patched like the nodes: the same pod security, scratch
    # folders and volumes (else restricted Pod Security refuses it).
    names = [TRAINER_NODE, MPI_LAUNCHER] if spec.runtime.is_mpi else [TRAINER_NODE]
    jobs = [
        tm.TrainerV1alpha1ReplicatedJobPatch(
            name=name,
            template=tm.TrainerV1alpha1JobTemplatePatch(
                spec=tm.TrainerV1alpha1JobSpecPatch(template=pod)
            ),
        )
        for name in names
    ]
    return tm.TrainerV1alpha1RuntimePatch(
        manager=PATCH_MANAGER,
        trainingRuntimeSpec=tm.TrainerV1alpha1TrainingRuntimeSpecPatch(
            template=tm.TrainerV1alpha1JobSetTemplatePatch(
                spec=tm.TrainerV1alpha1JobSetSpecPatch(replicatedJobs=jobs)
            )
        ),
    )


def build_trainjob_model(spec: TrainSpec) -> tm.TrainerV1alpha1TrainJob:
    """The job as the typed ``TrainerV1alpha1TrainJob`` model."""
    if spec.api != "trainjob":
        spec = spec.for_api("trainjob")  # refuses what a TrainJob cannot express
    return tm.TrainerV1alpha1TrainJob(
        apiVersion=API_VERSION,
        kind=KIND,
        metadata=tm.IoK8sApimachineryPkgApisMetaV1ObjectMeta(
            name=spec.name,
            namespace=spec.namespace,
            labels=spec.job_labels(),
            annotations=dict(spec.annotations) or None,
        ),
        spec=tm.TrainerV1alpha1TrainJobSpec(
            runtimeRef=tm.TrainerV1alpha1RuntimeRef(
                apiGroup=API_GROUP,
                kind=spec.runtime.runtime_kind or DEFAULT_RUNTIME_KIND,
                name=spec.runtime.runtime_name or DEFAULT_RUNTIME,
            ),
            trainer=_trainer(spec),
            runtimePatches=[_runtime_patch(spec)],
            activeDeadlineSeconds=spec.active_deadline_seconds,
            # Kueue admits a queued job by unsuspending it (Trainer's Kueue example).
            suspend=True if spec.kueue_queue else None,
        ),
    )


def build_trainjob(spec: TrainSpec) -> dict[str, Any]:
    """The TrainJob manifest of ``spec`` as a plain dict (pure; touches no cluster)."""
    return build_trainjob_model(spec).to_dict()
