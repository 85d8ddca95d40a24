"""The permissions the kubernetes backend uses: one list that pre-flight checks and rbac.yaml
grants (a test holds the three together with the calls the backend really makes)."""

from __future__ import annotations

from components.launcher.apis import JOB_APIS, JobApi

Permission = tuple[str, str, str]
"""(API group, resource[/subresource], verb)."""

JOB_VERBS = ("create", "get", "list", "watch", "patch", "delete")
"""patch: a job that failed for good is suspended and annotated with why (a retry reads it)."""
POD_PERMISSIONS: tuple[Permission, ...] = (
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/log", "get"),
    ("", "events", "list"),
)
MONITORING_PERMISSIONS: tuple[Permission, ...] = (
    ("monitoring.coreos.com", "podmonitors", "create"),
    ("monitoring.coreos.com", "prometheusrules", "create"),
)
"""With metrics_port: the job's PodMonitor and PrometheusRule, owned by the job (the garbage
collector deletes them with it, so no delete verb). Optional: a refusal is noted and the job
trains on, so pre-flight does not require them."""
SERVICEMONITOR_PERMISSIONS: tuple[Permission, ...] = (
    ("monitoring.coreos.com", "servicemonitors", "create"),
    ("", "services", "create"),
)
"""Only with metrics_monitor=servicemonitor: a headless Service and a ServiceMonitor instead of
the PodMonitor. Creating Services is not granted otherwise (the pipeline's account could make
LoadBalancers with it)."""
CHILD_JOBS_PERMISSION: Permission = ("batch", "jobs", "list")
"""Before a job that failed for a retryable reason is created again: its controller's Jobs
(a JobSet's, KubeRay's submitter) are gone (``JobApi.child_jobs``)."""
RUNTIME_PERMISSION: Permission = ("trainer.kubeflow.org", "trainingruntimes", "get")
"""Pre-flight reads a namespaced TrainingRuntime (a ClusterTrainingRuntime is cluster-scoped: it
is read when allowed and skipped with a note when not, since a Role cannot grant it)."""


def job_permissions(api: JobApi) -> tuple[Permission, ...]:
    return tuple((api.group, api.plural, verb) for verb in JOB_VERBS)


def required_permissions(
    api: JobApi, *, namespaced_runtime: bool = False
) -> tuple[Permission, ...]:
    """What a run with ``api`` calls in its namespace."""
    extra: tuple[Permission, ...] = (RUNTIME_PERMISSION,) if namespaced_runtime else ()
    if api.child_jobs is not None:
        extra += (CHILD_JOBS_PERMISSION,)
    return job_permissions(api) + POD_PERMISSIONS + extra


def granted_permissions(*, servicemonitor: bool = False) -> set[Permission]:
    """Everything the launcher's Role grants: every job API, pods, logs, events, runtimes,
    listing batch Jobs, the monitoring objects (``servicemonitor``: the Service +
    ServiceMonitor mode's too)."""
    granted = set(POD_PERMISSIONS) | {RUNTIME_PERMISSION, CHILD_JOBS_PERMISSION}
    granted |= set(MONITORING_PERMISSIONS)
    if servicemonitor:
        granted |= set(SERVICEMONITOR_PERMISSIONS)
    for api in JOB_APIS.values():
        granted |= set(job_permissions(api))
    return granted
