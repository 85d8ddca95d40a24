"""The launcher's RBAC: a Role + RoleBinding granting exactly what the kubernetes backend calls.

Built from ``backends.kubernetes.permissions`` (the list pre-flight checks), for every job API:
the TrainJob, PyTorchJob, TFJob, XGBoostJob, MPIJob and RayJob verbs, pods, pod logs, events,
namespaced TrainingRuntimes, listing batch Jobs, and creating the monitoring objects of
``metrics_port`` (PodMonitor, PrometheusRule; a Service and a ServiceMonitor only for
``servicemonitor``). No ClusterRole by default: SelfSubjectAccessReview is granted to every
authenticated user already (system:basic-user), and a Kubeflow profile owner could not create one;
``cluster_runtime_reader`` adds one for an admin to apply. ``rbac.yaml`` beside this file is the
rendering for the defaults (kept equal by a test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.launcher.backends.kubernetes.permissions import granted_permissions
from components.launcher.names import DNS1123_LABEL, DNS1123_SUBDOMAIN
from components.launcher.spec import SpecError

RBAC_FILE = Path(__file__).with_name("rbac.yaml")
ROLE_NAME = "kfp-ddp-launcher"
RUNTIME_READER = "kfp-ddp-clustertrainingruntime-reader"
HEADER = """\
# RBAC for the training-job launcher (components/launcher, kubernetes backend): exactly what it
# calls, for Kubeflow Trainer v2 TrainJobs, Training Operator v1 PyTorchJobs, TFJobs and
# XGBoostJobs, MPI Operator MPIJobs and KubeRay RayJobs alike.
#
# NAMESPACE: {namespace} (where the pipeline runs and the jobs are created).
# SERVICE ACCOUNT: {service_account} (the pipeline's: KFP standalone pipeline-runner; multi-user
# Kubeflow: default-editor in the profile namespace). Render for yours with
#   python -m components.launcher rbac --namespace NS --service-account SA | kubectl apply -f -
#
# No ClusterRole: SelfSubjectAccessReview (the pre-flight permission check) is allowed to every
# authenticated user, and reading a ClusterTrainingRuntime is optional (skipped when forbidden;
# --cluster-runtime-reader adds a ClusterRole for it). With metrics_port the launcher creates a
# PodMonitor and a PrometheusRule owned by the job: the garbage collector deletes them with it;
# Services (and ServiceMonitors) only with --servicemonitor (metrics_monitor=servicemonitor).
# Listing batch Jobs: a job that failed for a retryable reason is created again only once the
# Jobs its controller made (a JobSet's, KubeRay's submitter) are gone.
"""


def _rules(servicemonitor: bool) -> list[dict[str, Any]]:

    grouped: dict[tuple[str, str], list[str]] = {}
    for group, resource, verb in sorted(granted_permissions(servicemonitor=servicemonitor)):
        grouped.setdefault((group, resource), []).append(verb)
    order = ("create", "get", "list", "watch", "patch", "delete")
    return [
        {
            "apiGroups": [group],
            "resources": [resource],
            "verbs": sorted(verbs, key=lambda v: order.index(v) if v in order else len(order)),
        }
        for (group, resource), verbs in grouped.items()
    ]


def rbac_documents(
    *,
    namespace: str = "kubeflow",
    service_account: str = "pipeline-runner",
    servicemonitor: bool = False,
    cluster_runtime_reader: bool = False,
) -> list[dict[str, Any]]:
    """The Role and RoleBinding as dicts (``servicemonitor``: with what metrics_monitor=
    servicemonitor creates; ``cluster_runtime_reader``: plus a ClusterRole and
    ClusterRoleBinding to read ClusterTrainingRuntimes, for pre-flight)."""
    if not DNS1123_LABEL.match(namespace):
        raise SpecError(f"namespace={namespace!r} is not a valid namespace name")
    if not DNS1123_SUBDOMAIN.match(service_account):
        raise SpecError(f"service_account={service_account!r} is not a valid service account")
    metadata = {"name": ROLE_NAME, "namespace": namespace}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": dict(metadata),
        "rules": _rules(servicemonitor),
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": dict(metadata),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    if not cluster_runtime_reader:
        return [role, binding]
    return [role, binding, *_runtime_reader(namespace, service_account)]


def _runtime_reader(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """A ClusterRole to get ClusterTrainingRuntimes (cluster-scoped: no Role can grant it), bound
    to the service account: pre-flight then refuses a TrainJob whose runtime does not exist."""
    cluster_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": RUNTIME_READER},
        "rules": [
            {
                "apiGroups": ["trainer.kubeflow.org"],
                "resources": ["clustertrainingruntimes"],
                "verbs": ["get"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{RUNTIME_READER}-{namespace}-{service_account}"[:253]},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": RUNTIME_READER,
        },
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    return [cluster_role, binding]


def render_rbac(
    *,
    namespace: str = "kubeflow",
    service_account: str = "pipeline-runner",
    servicemonitor: bool = False,
    cluster_runtime_reader: bool = False,
) -> str:
    """The RBAC documents for ``namespace`` / ``service_account`` as YAML text."""
    docs = rbac_documents(
        namespace=namespace,
        service_account=service_account,
        servicemonitor=servicemonitor,
        cluster_runtime_reader=cluster_runtime_reader,
    )
    header = HEADER.format(namespace=namespace, service_account=service_account)
    return header + yaml.safe_dump_all(docs, sort_keys=False)
