"""``build_tfjob(spec)``: the Training Operator v1 TFJob of a TrainSpec (pure).

For TensorFlow programs (Kubeflow Trainer v2 has no TensorFlow runtime; the Training Operator
v1.9 still runs TFJobs). The mapping:

- replicas: ``Chief`` (1) + ``Worker`` (``workers - 1``) + ``PS`` (``ps_replicas``), with the
  pod template of every v1 job (built by ``training_operator``, like the PyTorchJob's), the
  container named ``tensorflow`` — the operator adds ``TF_CONFIG`` (cluster spec, task type and
  index) to it. GPUs go to the Chief and Workers only: parameter servers hold variables and
  apply updates on their CPUs;
- the user's ``image``, ``command`` and ``args`` (``TrainSpec`` refuses a TFJob without them:
  our PyTorch trainer is no TensorFlow program), ``env`` / NCCL preset, GPUs, CPU/memory,
  ``/dev/shm``, PVCs, node selector, tolerations, service account, pull secrets, host network,
  termination grace period, the Istio opt-out and the run labels on the job and its pods;
- ``runPolicy``: backoff limit, deadline, cleanPodPolicy, TTL and gang scheduling (Volcano),
  with restart policy OnFailure (the TFJob default; a PyTorchJob gets ExitCode), backoffLimit 3,
  cleanPodPolicy Running.

The job succeeds when the Chief does (the operator's default success policy). What a TFJob
cannot express (nprocPerNode, elastic policy, runtimes) ``TrainSpec`` refuses for
``api="tfjob"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubeflow.training import models as ktm

from components.launcher import training_operator
from components.launcher.spec import TrainSpec
from components.launcher.training_operator import API_VERSION

KIND = "TFJob"
CONTAINER_NAME = "tensorflow"
"""The operator finds its container (and injects TF_CONFIG) by this name."""
REPLICA_TYPES = ("Chief", "Master", "Worker", "PS", "Evaluator")
"""What the operator accepts; the builder uses Chief, Worker and PS."""


def replica_counts(spec: TrainSpec) -> dict[str, int]:
    """Replica type → replicas as the manifest will have them."""
    counts = {"Chief": 1}
    if spec.workers > 1:
        counts["Worker"] = spec.workers - 1
    if spec.ps_replicas:
        counts["PS"] = spec.ps_replicas
    return counts


def _replica_specs(spec: TrainSpec) -> dict[str, ktm.KubeflowOrgV1ReplicaSpec]:
    counts = replica_counts(spec)
    ps = {"PS": counts.pop("PS")} if "PS" in counts else {}
    specs = training_operator.replica_specs(spec, counts, CONTAINER_NAME)
    if ps:
        cpu_only = dataclasses.replace(spec, gpus_per_worker=0)
        specs |= training_operator.replica_specs(cpu_only, ps, CONTAINER_NAME)
    return specs


def build_tfjob_model(spec: TrainSpec) -> ktm.KubeflowOrgV1TFJob:
    """The job as kubeflow-training's ``KubeflowOrgV1TFJob`` (what TrainingClient takes)."""
    return ktm.KubeflowOrgV1TFJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=training_operator.job_metadata(spec),
        spec=ktm.KubeflowOrgV1TFJobSpec(
            tf_replica_specs=_replica_specs(spec),
            run_policy=training_operator.run_policy(spec),
        ),
    )


def build_tfjob(spec: TrainSpec) -> dict[str, Any]:
    """The TFJob manifest of ``spec`` as a plain dict (pure; touches no cluster)."""
    if spec.api != "tfjob":
        spec = spec.for_api("tfjob")  # refuses what a TFJob cannot express
    return training_operator.plain_checked(build_tfjob_model(spec), admission_errors)


def admission_errors(manifest: dict[str, Any]) -> list[str]:
    """The Training Operator v1 TFJob webhook rules ``manifest`` breaks (empty: none).

    The rules of every v1 job (``training_operator.webhook_errors``) with the TFJob's replica
    types and a container named ``tensorflow``, and at most one Chief or Master.
    """
    errors = training_operator.webhook_errors(
        manifest, "tfReplicaSpecs", CONTAINER_NAME, REPLICA_TYPES
    )
    replicas = (manifest.get("spec") or {}).get("tfReplicaSpecs") or {}
    if sum(rtype in ("Chief", "Master") for rtype in replicas) > 1:
        errors.append("spec.tfReplicaSpecs: must not have more than 1 Chief or Master role")
    return errors
