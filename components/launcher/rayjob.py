"""``build_rayjob(spec)``: the KubeRay ``RayJob`` of a TrainSpec (pure).

For clusters that run Ray (the KubeRay operator, ``ray.io/v1``). A RayJob in ``K8sJobMode``
becomes a RayCluster (a head pod and a worker group), and, once its pods are ready, a submitter
Job whose pod runs ``ray job submit`` against the head's dashboard: the entrypoint then runs as
the Ray job's driver on the head. The mapping:

- the head: the spec's image, env, pod security, scratch folders and scheduling,
  ``num-cpus: 0`` so that no training lands on it, small requests (``ray_head_cpu``,
  ``ray_head_memory``; by default ``HEAD_CPU``, ``HEAD_MEMORY``: the GCS, the dashboard and the
  driver);
- one worker group (``workers``) of ``workers`` pods, fixed (min = max = replicas), each as a
  node of the other APIs: GPUs, CPU/memory, the staging init container and volumes, the
  Ray container advertising ``nproc_per_node`` CPUs to Ray (``num-cpus``) so that
  Ray Train places exactly ``nproc_per_node`` workers on each pod, and, when our trainer runs,
  a ``preStop`` hook (``python -m trainer.stop_file``) that asks the pod's trainers to
  checkpoint and waits until they have (the pod's SIGTERM never reaches them: PID 1 is
  ``ray start``), at most the pod's grace period less ``STOP_MARGIN_S``;
- the entrypoint: our trainer under Ray Train (``python -m trainer.ray_train``: a
  ``TorchTrainer`` of ``workers × nproc_per_node`` workers, each running the trainer's own
  loop), or the user's ``command`` and ``args``;
- the submitter pod (``submitterPodTemplate``): the same image and pod security (KubeRay fills
  in its ``ray job submit`` command), small requests;
- ``shutdownAfterJobFinishes`` (the Ray cluster goes when the job ends) with
  ``ttlSecondsAfterFinished``, ``activeDeadlineSeconds``, ``backoffLimit`` (0 by default: a
  RayJob retried by KubeRay builds a new cluster and cannot tell a permanent error; a retried
  pipeline step resumes from the checkpoints instead), ``suspend`` for Kueue-queued jobs.

KubeRay sets each Ray container's command (``ray start ...``), adds its ``wait-gcs-ready``
init container to the workers (the worker's image and securityContext) and its own env
(``RAY_ADDRESS``...). The probes are ours, HTTP GETs that the kubelet makes itself: KubeRay's
run ``wget`` (which our image lacks) in the container, and an exec probe costs a process in the
pod at every check (Python's, ~0.1 s of CPU: a few % of a core per pod for the whole job). Every
pod's liveness asks its dashboard agent's ``/api/healthz`` (the raylet's health, and on the head
the GCS's: Ray ≥ 2.53, as KubeRay's own HTTP probes); a worker is ready when that answers, the
head when its dashboard does (``/api/gcs_healthz``: the job is submitted there). The image needs
the ``ray`` extra (``ray[default,train]``: the dashboard agent, the job CLI, Ray Train).
"""

from __future__ import annotations

import copy
import dataclasses
import shlex
from typing import Any

from components.launcher import pod_parts, training_operator
from components.launcher.spec import TrainSpec

API_GROUP = "ray.io"
API_VERSION = f"{API_GROUP}/v1"
KIND = "RayJob"
CONTAINER = "ray"
"""Every pod's one container (head, workers, submitter): KubeRay finds it by its place (the
first), the launcher follows its log by this name."""
WORKER_GROUP = "workers"
JOB_LABEL = "kfp-ddp.io/ray-job"
"""On every pod of the job (head, workers, submitter): the RayJob's name (KubeRay labels the
cluster's pods with the RayCluster's generated name only)."""
HEAD_CPU = "500m"
HEAD_MEMORY = "2Gi"
SUBMITTER_CPU = "200m"
SUBMITTER_MEMORY = "512Mi"
DEFAULT_BACKOFF_LIMIT = 0
DEFAULT_TTL_SECONDS = 60
"""How long KubeRay keeps the finished job's Ray cluster (with shutdownAfterJobFinishes): a
minute. Its pods keep running (and holding their GPUs) until then, failed or not; the driver's
log stays in the submitter Job, which goes with the RayJob."""
RAY_TRAIN = ("python", "-m", "trainer.ray_train")
STOP_HOOK = ("python", "-m", "trainer.stop_file")
"""A worker pod's preStop hook: creates the stop file its trainers watch (``$TMPDIR``, the pod's
/tmp emptyDir), then waits for them to checkpoint and return, at most ``--wait-s``."""
KUBERNETES_GRACE_S = 30
"""Kubernetes' terminationGracePeriodSeconds when the pod sets none."""
STOP_MARGIN_S = 5
"""Of a worker pod's grace period, what the preStop hook leaves for Ray to stop after it."""
AGENT_PORT = 52365
"""The dashboard agent's port on every Ray node (Ray's and KubeRay's default)."""
NODE_HEALTH = "/api/healthz"
"""The agent's health of its node: 200 when the raylet (and on the head, the GCS) is alive."""
DASHBOARD_PORT = 8265
GCS_HEALTH = "/api/gcs_healthz"
"""The head's dashboard: 200 when it serves and the GCS is alive (``ray job submit`` needs both)."""
READY_AFTER_S = 2
"""The readiness probe's first check, seconds after ``ray start``. KubeRay's default is 10, but a
failed readiness check before Ray is up costs nothing, and KubeRay submits the job only once
every pod is ready: a worker ready a few seconds after it starts is seen then, not at 10 s."""
READY_EVERY_S = 2
"""Between readiness checks (KubeRay's: 5). A GET the kubelet makes costs the pod next to nothing,
and a Ray node is up some seconds after ``ray start``: checked every 5 s, a worker found ready
at the second check waited ~3 s more for it, and the job's submission waits for the last
worker."""


def _probe(port: int, path: str, *, initial_s: int, every_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "initialDelaySeconds": initial_s,
        "periodSeconds": every_s,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def entrypoint(spec: TrainSpec) -> list[str]:
    """What the Ray job's driver runs on the head: our trainer under Ray Train, or the user's
    program."""
    if spec.command is not None:
        return [*spec.command, *spec.args]
    per_process_gpus = (spec.gpus_per_worker or 0) // (spec.nproc_per_node or 1)
    return [
        *RAY_TRAIN,
        *("--workers", str(spec.world_size)),
        *("--cpus-per-worker", "1"),
        *("--gpus-per-worker", str(per_process_gpus)),
        *("--name", spec.name),
        "--",
        *spec.container_args(),
    ]


def stop_hook(spec: TrainSpec) -> dict[str, Any] | None:
    """A worker's ``preStop`` hook when our trainer is the entrypoint (None for a program of the
    user's, which watches no stop file): the hook's wait fits the pod's grace period, which
    the hook's own time counts against."""
    if spec.command is not None:
        return None
    grace = spec.termination_grace_period_seconds
    wait_s = max(0, (KUBERNETES_GRACE_S if grace is None else grace) - STOP_MARGIN_S)
    return {"exec": {"command": [*STOP_HOOK, "--wait-s", str(wait_s)]}}


def _template(spec: TrainSpec, container: str, *, node: bool) -> dict[str, Any]:
    """A Ray pod's template: a node's (``node``: GPUs, requests, staging) or the head's."""
    template = pod_parts.plain(training_operator.build_pod_template(spec, container))
    pod = template["spec"]
    (ray,) = pod["containers"]
    for key in ("command", "args", "ports"):  # KubeRay sets the command and its ports
        ray.pop(key, None)
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels[JOB_LABEL] = spec.name
    # KubeRay adds wget probes to a Ray container that has none; the kubelet makes ours.
    ready = (AGENT_PORT, NODE_HEALTH) if node else (DASHBOARD_PORT, GCS_HEALTH)
    # unready after 50 s of failed checks, as with KubeRay's (10 checks 5 s apart)
    ray["readinessProbe"] = _probe(
        *ready, initial_s=READY_AFTER_S, every_s=READY_EVERY_S, failures=50 // READY_EVERY_S
    )
    ray["livenessProbe"] = _probe(AGENT_PORT, NODE_HEALTH, initial_s=30, every_s=5, failures=120)
    hook = stop_hook(spec) if node else None  # the head trains nothing
    if hook:
        ray["lifecycle"] = {"preStop": hook}
    if not node:
        cpu = spec.ray.ray_head_cpu or HEAD_CPU
        memory = spec.ray.ray_head_memory or HEAD_MEMORY
        ray["resources"] = {
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"memory": memory},
        }
    return template


def _submitter(spec: TrainSpec, head: dict[str, Any]) -> dict[str, Any]:
    pod = head["spec"]
    (ray,) = pod["containers"]
    container = {
        "name": CONTAINER,
        "image": spec.image,
        "env": [e for e in ray.get("env") or [] if "valueFrom" not in e],  # no secret needed
        "resources": {
            "requests": {"cpu": SUBMITTER_CPU, "memory": SUBMITTER_MEMORY},
            "limits": {"memory": SUBMITTER_MEMORY},
        },
        "securityContext": ray.get("securityContext"),
        "volumeMounts": [m for m in ray.get("volumeMounts") or [] if m["mountPath"] in _SCRATCH],
    }
    volumes = {m["name"] for m in container["volumeMounts"]}
    spec_ = {
        "restartPolicy": "Never",
        "containers": [container],
        "securityContext": pod.get("securityContext"),
        "volumes": [v for v in pod.get("volumes") or [] if v["name"] in volumes],
        **{
            key: pod[key]
            for key in (
                "serviceAccountName",
                "imagePullSecrets",
                "nodeSelector",
                "affinity",
                "tolerations",
            )
            if pod.get(key)
        },
    }
    return {"metadata": head["metadata"], "spec": spec_}


_SCRATCH = {d.path for d in pod_parts.SCRATCH_DIRS}


def build_rayjob(spec: TrainSpec) -> dict[str, Any]:
    """The RayJob manifest of ``spec`` as a plain dict (pure; touches no cluster)."""
    if spec.api != "rayjob":
        spec = spec.for_api("rayjob")  # refuses what a RayJob cannot express
    options = spec.ray
    # The head trains nothing: no data staged there, no staging volume.
    head_spec = dataclasses.replace(spec, stage_data_uri=None, stage_data_digest=None)
    head = _template(head_spec, CONTAINER, node=False)
    worker = _template(spec, CONTAINER, node=True)
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": spec.job_labels(),
    }
    if spec.annotations:
        metadata["annotations"] = dict(spec.annotations)
    backoff = options.backoff_limit
    ttl = options.ttl_seconds_after_finished
    body: dict[str, Any] = {
        "entrypoint": shlex.join(entrypoint(spec)),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": DEFAULT_TTL_SECONDS if ttl is None else ttl,
        "backoffLimit": DEFAULT_BACKOFF_LIMIT if backoff is None else backoff,
        "submitterPodTemplate": _submitter(spec, copy.deepcopy(head)),
        "rayClusterSpec": {
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": head,
            },
            "workerGroupSpecs": [
                {
                    "groupName": WORKER_GROUP,
                    "replicas": spec.workers,
                    "minReplicas": spec.workers,
                    "maxReplicas": spec.workers,
                    "rayStartParams": {"num-cpus": str(spec.nproc_per_node or 1)},
                    "template": worker,
                }
            ],
        },
    }
    if spec.active_deadline_seconds is not None:
        body["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.kueue_queue:
        body["suspend"] = True  # Kueue admits it
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": body}
