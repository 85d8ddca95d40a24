"""``build_xgboostjob(spec)``: the Training Operator v1 XGBoostJob of a TrainSpec (pure).

For XGBoost programs on a cluster with the Training Operator v1.9 (``--enable-scheme=xgboostjob``;
Kubeflow Trainer v2 runs XGBoost as a TrainJob on its ``xgboost-distributed`` runtime instead).
The mapping:

- replicas: ``Master`` (1) + ``Worker`` (``workers - 1``), with the pod template of every v1 job
  (``training_operator``), the container named ``xgboost`` with the port ``xgboostjob-port``
  (9999) that the operator reads: it gives every replica MASTER_ADDR (``<job>-master-0``),
  MASTER_PORT (that port: the master runs XGBoost's tracker on it), WORLD_SIZE, RANK (master 0,
  worker i: i + 1) and WORKER_ADDRS/WORKER_PORT; the program starts under ``sh -c`` that sets
  XGBoost's ``DMLC_*`` contract (Kubeflow Trainer's XGBoost runtime's) from them
  (``DMLC_FROM_OPERATOR``), so one program runs on both APIs;
- the user's ``image``, ``command`` and ``args`` (``TrainSpec`` refuses an XGBoostJob without
  them: our PyTorch trainer is no XGBoost program), env, GPUs, CPU/memory, volumes, node
  selector, tolerations, service account, pull secrets, the Istio opt-out, the run labels;
- ``runPolicy``: backoff limit, deadline, cleanPodPolicy, TTL, gang scheduling, with restart
  policy Never (the operator's XGBoost default: a worker restarted alone cannot rejoin the
  tracker, so a failed replica fails the job; a retried pipeline step resumes from the
  program's checkpoints).

The job succeeds when the Master does (the operator's XGBoost success policy).
"""

from __future__ import annotations

from typing import Any

from kubeflow.training import models as ktm
from kubernetes import client as k8s

from components.launcher import training_operator
from components.launcher.spec import TrainSpec
from components.launcher.training_operator import API_VERSION

KIND = "XGBoostJob"
CONTAINER_NAME = "xgboost"
"""The operator finds its container (and its port) by this name."""
PORT_NAME = "xgboostjob-port"
PORT = 9999
"""The operator's default: the master's tracker port (MASTER_PORT) and the workers' port."""
REPLICA_TYPES = ("Master", "Worker")
DMLC_FROM_OPERATOR = (
    'export DMLC_TRACKER_URI="$MASTER_ADDR" DMLC_TRACKER_PORT="$MASTER_PORT" '
    'DMLC_TASK_ID="$RANK" DMLC_NUM_WORKER="$WORLD_SIZE"; exec "$@"'
)
"""The shell line before the program: XGBoost's DMLC_* variables, as Kubeflow Trainer's XGBoost
runtime gives them, from the operator's (which it appends after the pod's own env, so ``$(VAR)``
in the env cannot refer to them). ``exec`` leaves the program the container's process: its
exit code and signals are its own."""


def dmlc_command(command: list[str]) -> list[str]:
    """``command`` run with the DMLC_* contract set from the operator's variables (``sh``)."""
    return ["sh", "-c", DMLC_FROM_OPERATOR, "sh", *command]


def replica_counts(spec: TrainSpec) -> dict[str, int]:
    """Replica type → replicas as the manifest will have them."""
    counts = {"Master": 1}
    if spec.workers > 1:
        counts["Worker"] = spec.workers - 1
    return counts


def build_xgboostjob_model(spec: TrainSpec) -> ktm.KubeflowOrgV1XGBoostJob:
    """The job as kubeflow-training's ``KubeflowOrgV1XGBoostJob`` (what TrainingClient takes)."""
    port = k8s.V1ContainerPort(name=PORT_NAME, container_port=PORT, protocol="TCP")
    specs = training_operator.replica_specs(
        spec, replica_counts(spec), CONTAINER_NAME, ports=[port]
    )
    containers = {id(c): c for r in specs.values() for c in r.template.spec.containers}
    for container in containers.values():  # the replicas may share one container object
        container.command = dmlc_command(container.command)
    return ktm.KubeflowOrgV1XGBoostJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=training_operator.job_metadata(spec),
        spec=ktm.KubeflowOrgV1XGBoostJobSpec(
            xgb_replica_specs=specs,
            run_policy=training_operator.run_policy(spec),
        ),
    )


def build_xgboostjob(spec: TrainSpec) -> dict[str, Any]:
    """The XGBoostJob manifest of ``spec`` as a plain dict (pure; touches no cluster)."""
    if spec.api != "xgboostjob":
        spec = spec.for_api("xgboostjob")  # refuses what an XGBoostJob cannot express
    return training_operator.plain_checked(build_xgboostjob_model(spec), admission_errors)


def admission_errors(manifest: dict[str, Any]) -> list[str]:
    """The Training Operator v1 XGBoostJob webhook rules ``manifest`` breaks (empty: none).

    The rules of every v1 job (``training_operator.webhook_errors``) with the XGBoostJob's
    replica types and a container named ``xgboost``, and exactly one Master.
    """
    errors = training_operator.webhook_errors(
        manifest, "xgbReplicaSpecs", CONTAINER_NAME, REPLICA_TYPES
    )
    replicas = (manifest.get("spec") or {}).get("xgbReplicaSpecs") or {}
    master = replicas.get("Master")
    if master is None:
        errors.append("spec.xgbReplicaSpecs[Master]: must be present")
    elif master.get("replicas") != 1:
        errors.append("spec.xgbReplicaSpecs[Master].replicas: must be 1")
    return errors
