"""The launcher's RBAC: a Role + RoleBinding granting exactly what the kubernetes backend calls.

Built from ``backends.kubernetes.permissions`` (the list pre-flight checks), for every job API:
the TrainJob, PyTorchJob and TFJob verbs, pods, pod logs, events, namespaced TrainingRuntimes, and
creating the monitoring objects of ``metrics_port`` (Prometheus Operator kinds, a Service). No
ClusterRole: SelfSubjectAccessReview is granted to every authenticated user already
(system:basic-user), and a Kubeflow profile owner could not create one. ``rbac.yaml`` beside this
file is the rendering for the defaults (kept equal by a test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.launcher.names import DNS1123_LABEL, DNS1123_SUBDOMAIN
from components.launcher.spec import SpecError

RBAC_FILE = Path(__file__).with_name("rbac.yaml")
ROLE_NAME = "kfp-ddp-launcher"
HEADER = """\
# RBAC for the training-job launcher (components/launcher, kubernetes backend): exactly what it
# calls, for Kubeflow Trainer v2 TrainJobs and Training Operator v1 PyTorchJobs and TFJobs alike.
#
# NAMESPACE: where the pipeline runs and the jobs are created (here: kubeflow).
# SERVICE ACCOUNT: the pipeline's service account (KFP standalone: pipeline-runner; multi-user
# Kubeflow: default-editor in the profile namespace). Render for yours with
#   python -m components.launcher rbac --namespace NS --service-account SA | kubectl apply -f -
#
# No ClusterRole: SelfSubjectAccessReview (the pre-flight permission check) is allowed to every
# authenticated user, and reading a ClusterTrainingRuntime is optional (skipped when forbidden).
# With metrics_port the launcher creates a PodMonitor (or Service + ServiceMonitor) and a
# PrometheusRule owned by the job: the garbage collector deletes them with it.
"""


def _rules() -> list[dict[str, Any]]:
    from components.launcher.backends.kubernetes.permissions import granted_permissions

    grouped: dict[tuple[str, str], list[str]] = {}
    for group, resource, verb in sorted(granted_permissions()):
        grouped.setdefault((group, resource), []).append(verb)
    order = ("create", "get", "list", "watch", "delete")
    return [
        {
            "apiGroups": [group],
            "resources": [resource],
            "verbs": sorted(verbs, key=lambda v: order.index(v) if v in order else len(order)),
        }
        for (group, resource), verbs in grouped.items()
    ]


def rbac_documents(
    *, namespace: str = "kubeflow", service_account: str = "pipeline-runner"
) -> list[dict[str, Any]]:
    """The Role and RoleBinding as dicts."""
    if not DNS1123_LABEL.match(namespace):
        raise SpecError(f"namespace={namespace!r} is not a valid namespace name")
    if not DNS1123_SUBDOMAIN.match(service_account):
        raise SpecError(f"service_account={service_account!r} is not a valid service account")
    metadata = {"name": ROLE_NAME, "namespace": namespace}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": dict(metadata),
        "rules": _rules(),
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": dict(metadata),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    return [role, binding]


def render_rbac(*, namespace: str = "kubeflow", service_account: str = "pipeline-runner") -> str:
    """The RBAC documents for ``namespace`` / ``service_account`` as YAML text."""
    docs = rbac_documents(namespace=namespace, service_account=service_account)
    return HEADER + yaml.safe_dump_all(docs, sort_keys=False)
