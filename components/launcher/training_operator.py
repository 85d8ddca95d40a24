"""What the Training Operator v1 jobs (PyTorchJob, TFJob, XGBoostJob) share: pod template, run
policy, rules.

The kinds are ``kubeflow.org/v1`` jobs with a map of replica type → ``ReplicaSpec`` (replicas,
restart policy, one pod template) and the same ``runPolicy``; they differ in the replica types,
the container the operator looks for (``pytorch`` / ``tensorflow`` / ``xgboost``) and the env
it injects. Built with kubeflow-training's models and the kubernetes client's pod models;
``webhook_errors`` restates the rules the operator's validating webhooks share
(``webhooks/utils``, ``ValidateRunPolicy``), each kind's builder adds its own.
"""

from __future__ import annotations

from typing import Any

from kubeflow.training import models as ktm
from kubernetes import client as k8s

from components.launcher import monitoring, pod_parts, pod_security
from components.launcher.names import DNS1035
from components.launcher.spec import CLEAN_POD_POLICIES, RESTART_POLICIES, TrainSpec

API_VERSION = "kubeflow.org/v1"
DEFAULT_RESTART_POLICIES = {"pytorchjob": "ExitCode", "tfjob": "OnFailure", "xgboostjob": "Never"}
"""PyTorchJob (our trainer's exit codes): 1-127 (bad config, bad data: 2, 3, 4) are permanent,
signals and 128-255 (preemption, a lost peer: 143, 137, 200) are retried, so a permanent error
never restarts the containers on every GPU. TFJob (the user's TensorFlow program, whose lost peer
is an exception, exit 1): the operator's own default, any failure is retried. XGBoostJob: the
operator's own default, Never — a worker restarted alone cannot rejoin XGBoost's tracker, so a
failed replica fails the job, and a retried pipeline step resumes from the checkpoints."""
DEFAULT_BACKOFF_LIMIT = 3
DEFAULT_CLEAN_POD_POLICY = "Running"
DEFAULT_TTL_SECONDS = 7 * 24 * 3600
"""A finished job the launcher keeps (a failed one, for inspection) is deleted by the operator
after a week."""


class ManifestError(ValueError):
    """A manifest breaks one of the Training Operator's admission rules."""


def build_pod_template(
    spec: TrainSpec,
    container_name: str,
    env: dict[str, str] | None = None,
    ports: list[k8s.V1ContainerPort] | None = None,
) -> k8s.V1PodTemplateSpec:
    """The pod template every replica uses (the replica types differ only in their name);
    ``env``: the kind's own variables, before the spec's (which win); ``ports``: the kind's own
    container ports, before the metrics ports."""
    volumes, mounts = pod_parts.volumes(spec)
    own = [k8s.V1EnvVar(name=k, value=v) for k, v in (env or {}).items() if k not in spec.env]
    container = k8s.V1Container(
        name=container_name,
        image=spec.image,
        command=spec.container_command(),
        args=spec.container_args() or None,
        env=own + pod_parts.env_vars(spec),
        resources=pod_parts.resources(spec),
        volume_mounts=mounts or None,
        security_context=pod_security.container_context(spec),
        ports=[*(ports or []), *(monitoring.container_ports(spec) or [])] or None,
    )
    init = pod_parts.stage_init_container(spec)
    pod_spec = k8s.V1PodSpec(
        containers=[container],
        init_containers=[init] if init else None,
        security_context=pod_security.pod_context(spec),
        volumes=volumes or None,
        host_network=spec.operator.host_network or None,
        dns_policy="ClusterFirstWithHostNet" if spec.operator.host_network else None,
        node_selector=dict(spec.node_selector) or None,
        affinity=spec.extras.affinity,
        tolerations=pod_parts.tolerations(spec),
        service_account_name=spec.service_account,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in spec.image_pull_secrets]
        or None,
        scheduler_name=spec.operator.scheduler_name,
        termination_grace_period_seconds=spec.termination_grace_period_seconds,
    )
    metadata = k8s.V1ObjectMeta(
        labels=spec.job_labels(), annotations=monitoring.pod_annotations(spec)
    )
    return k8s.V1PodTemplateSpec(metadata=metadata, spec=pod_spec)


def default_restart_policy(spec: TrainSpec) -> str:
    """The spec's restart policy, else the default of its API (``DEFAULT_RESTART_POLICIES``)."""
    return spec.operator.restart_policy or DEFAULT_RESTART_POLICIES.get(spec.api, "ExitCode")


def replica_specs(
    spec: TrainSpec,
    counts: dict[str, int],
    container_name: str,
    env: dict[str, str] | None = None,
    ports: list[k8s.V1ContainerPort] | None = None,
) -> dict[str, ktm.KubeflowOrgV1ReplicaSpec]:
    """Replica type → its ReplicaSpec: ``counts`` replicas of the one pod template."""
    template = build_pod_template(spec, container_name, env, ports)
    return {
        rtype: ktm.KubeflowOrgV1ReplicaSpec(
            replicas=count,
            restart_policy=default_restart_policy(spec),
            template=template,
        )
        for rtype, count in counts.items()
    }


def run_policy(spec: TrainSpec) -> ktm.KubeflowOrgV1RunPolicy:
    """Backoff limit, deadline, pod cleanup, TTL and gang scheduling (the launcher's defaults)."""
    options = spec.operator
    scheduling = None
    if options.gang:
        elastic = spec.pytorchjob
        scheduling = ktm.KubeflowOrgV1SchedulingPolicy(
            # Gang scheduling: every pod or none, so a half-placed job never holds GPUs idle.
            min_available=options.min_available
            or (elastic.elastic_min_replicas if elastic and elastic.elastic else spec.pod_count),
            queue=options.queue,
            priority_class=options.priority_class,
        )
    backoff = options.backoff_limit
    ttl = options.ttl_seconds_after_finished
    return ktm.KubeflowOrgV1RunPolicy(
        backoff_limit=DEFAULT_BACKOFF_LIMIT if backoff is None else backoff,
        active_deadline_seconds=spec.active_deadline_seconds,
        clean_pod_policy=options.clean_pod_policy or DEFAULT_CLEAN_POD_POLICY,
        ttl_seconds_after_finished=DEFAULT_TTL_SECONDS if ttl is None else ttl,
        scheduling_policy=scheduling,
    )


def job_metadata(spec: TrainSpec) -> k8s.V1ObjectMeta:
    return k8s.V1ObjectMeta(
        name=spec.name,
        namespace=spec.namespace,
        labels=spec.job_labels(),
        annotations=dict(spec.annotations) or None,
    )


def plain_checked(model: Any, errors_of) -> dict[str, Any]:
    """``model`` as plain API JSON, refused if ``errors_of`` finds a broken admission rule."""
    manifest = pod_parts.plain(model)
    errors = errors_of(manifest)
    if errors:  # A bug in the builder, not in the spec: TrainSpec already refused bad values.
        raise ManifestError("; ".join(errors))
    return manifest


def webhook_errors(
    manifest: dict[str, Any], replicas_key: str, container: str, replica_types: tuple[str, ...]
) -> list[str]:
    """The rules every v1 job's validating webhook checks that ``manifest`` breaks.

    DNS-1035 name; ``spec.<replicas_key>`` set, each replica type one of ``replica_types``, with
    containers, one named ``container`` and every image set; run policy numbers non-negative.
    Also the enums the CRD schema leaves open (restartPolicy, cleanPodPolicy).
    """
    errors: list[str] = []
    name = (manifest.get("metadata") or {}).get("name") or ""
    if len(name) > 63 or not DNS1035.match(name):
        errors.append(f"metadata.name {name!r}: must be a DNS-1035 label")
    spec = manifest.get("spec") or {}
    replicas = spec.get(replicas_key)
    if not replicas:
        errors.append(f"spec.{replicas_key}: must be set")
        replicas = {}
    for rtype, rspec in replicas.items():
        path = f"spec.{replicas_key}[{rtype}]"
        if rtype not in replica_types:
            allowed = ", ".join(replica_types[:-1]) + " or " + replica_types[-1]
            errors.append(f"{path}: replica type must be {allowed}")
        errors += _replica_errors(path, rspec or {}, container)
    run = spec.get("runPolicy") or {}
    for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if run.get(key) is not None and run[key] < 0:
            errors.append(f"spec.runPolicy.{key}: must be non-negative")
    clean = run.get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        errors.append(f"spec.runPolicy.cleanPodPolicy {clean!r}: allowed {CLEAN_POD_POLICIES}")
    return errors


def _replica_errors(path: str, rspec: dict[str, Any], container: str) -> list[str]:
    """One ReplicaSpec: containers, one named ``container``, images, replicas, restart policy."""
    errors = []
    containers = ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        errors.append(f"{path}.template.spec.containers: must be specified")
    if containers and not any(c.get("name") == container for c in containers):
        errors.append(f"{path}: needs a container named {container!r}")
    for i, c in enumerate(containers):
        if not c.get("image"):
            errors.append(f"{path}.template.spec.containers[{i}].image: must be set")
    count = rspec.get("replicas")
    if count is not None and count < 0:
        errors.append(f"{path}.replicas: must be non-negative (got {count})")
    policy = rspec.get("restartPolicy")
    if policy is not None and policy not in RESTART_POLICIES:
        errors.append(f"{path}.restartPolicy {policy!r}: allowed {RESTART_POLICIES}")
    return errors
