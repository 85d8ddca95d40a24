"""``build_pytorchjob(spec)``: the Training Operator v1 PyTorchJob of a TrainSpec (pure).

Built with kubeflow-training's models and the kubernetes client's pod models (the pod template and
run policy every v1 job shares come from ``training_operator``), serialised with the client's own
``sanitize_for_serialization``, so field names and nesting come from the generated API types
rather than hand-written dicts. ``admission_errors`` re-states the Training Operator's
validating-webhook rules as a self-check of this module.
"""

from __future__ import annotations

from typing import Any

from kubeflow.training import models as ktm

from components.launcher import training_operator
from components.launcher.spec import TrainSpec
from components.launcher.training_operator import API_VERSION

KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"
"""The operator finds its container (and injects the PET_* env) by this name."""
REPLICA_TYPES = ("Master", "Worker")
RENDEZVOUS_PORT = 29400
"""torchrun's c10d rendezvous port (its default), on worker-0."""


def replica_counts(spec: TrainSpec) -> dict[str, int]:
    """Replica type → replicas as the manifest will have them.

    Workers only (the default, and elastic jobs): no Master, so the v1.9 operator adds no
    init-pytorch container (whose missing securityContext restricted Pod Security refuses).
    ``pytorch_master``: a Master and workers-1 Workers, with MASTER_ADDR/RANK/WORLD_SIZE.
    """
    if spec.workers_only:
        return {"Worker": spec.workers}
    return {"Master": 1} | ({"Worker": spec.workers - 1} if spec.workers > 1 else {})


def rendezvous_env(spec: TrainSpec) -> dict[str, str]:
    """Workers only, not elastic: torchrun meets at worker-0 through its c10d rendezvous (the
    operator sets PET_NNODES = workers and PET_NPROC_PER_NODE; worker-0 hosts the store: its
    hostname is the endpoint's). Elastic jobs get these from the operator's elasticPolicy."""
    if not spec.workers_only or spec.elastic:
        return {}
    return {
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{spec.name}-worker-0:{RENDEZVOUS_PORT}",
        "PET_RDZV_ID": spec.name,
    }


def build_pytorchjob_model(spec: TrainSpec) -> ktm.KubeflowOrgV1PyTorchJob:
    """The job as kubeflow-training's ``KubeflowOrgV1PyTorchJob`` (what TrainingClient takes)."""
    elastic = None
    options = spec.pytorchjob
    if options is not None and options.elastic:
        elastic = ktm.KubeflowOrgV1ElasticPolicy(
            min_replicas=options.elastic_min_replicas,
            max_replicas=options.elastic_max_replicas,
            max_restarts=options.max_restarts,
            rdzv_backend="c10d",
        )
    return ktm.KubeflowOrgV1PyTorchJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=training_operator.job_metadata(spec),
        spec=ktm.KubeflowOrgV1PyTorchJobSpec(
            pytorch_replica_specs=training_operator.replica_specs(
                spec, replica_counts(spec), CONTAINER_NAME, rendezvous_env(spec)
            ),
            # Only here, never also in elasticPolicy.nProcPerNode (the webhook refuses both).
            nproc_per_node=str(spec.nproc_per_node),
            elastic_policy=elastic,
            run_policy=training_operator.run_policy(spec),
        ),
    )


def build_pytorchjob(spec: TrainSpec) -> dict[str, Any]:
    """The PyTorchJob manifest of ``spec`` as a plain dict (pure; touches no cluster)."""
    if spec.api != "pytorchjob":
        spec = spec.for_api("pytorchjob")
    return training_operator.plain_checked(build_pytorchjob_model(spec), admission_errors)


def admission_errors(manifest: dict[str, Any]) -> list[str]:
    """The Training Operator v1 validating-webhook rules ``manifest`` breaks (empty: none).

    The rules of every v1 job (``training_operator.webhook_errors``) with replica types
    Master/Worker and a container named ``pytorch``; Master replicas exactly 1, other replicas
    >= 1; an elastic policy needs a Worker and must not set nProcPerNode together with
    spec.nprocPerNode.
    """
    errors = training_operator.webhook_errors(
        manifest, "pytorchReplicaSpecs", CONTAINER_NAME, REPLICA_TYPES
    )
    spec = manifest.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs") or {}
    for rtype, rspec in replicas.items():
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        count = (rspec or {}).get("replicas")
        if rtype == "Master" and count != 1:
            errors.append(f"{path}.replicas: must be 1 (got {count})")
        elif rtype != "Master" and count is not None and count < 1:
            errors.append(f"{path}.replicas: must be at least 1 (got {count})")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "Worker" not in replicas:
            errors.append("spec.pytorchReplicaSpecs[Worker]: must be configured with elasticPolicy")
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            errors.append("spec.elasticPolicy.nProcPerNode: must not be used with nprocPerNode")
    return errors
