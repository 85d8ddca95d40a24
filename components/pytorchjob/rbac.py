"""rbac.yaml (next to this file) rendered for a namespace and service account."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.pytorchjob.spec import DNS1123_LABEL, DNS1123_SUBDOMAIN, SpecError

RBAC_FILE = Path(__file__).with_name("rbac.yaml")


def rbac_documents(*, namespace: str = "kubeflow", service_account: str = "pipeline-runner"):
    """The Role, RoleBinding, ClusterRole and ClusterRoleBinding as dicts."""
    if not DNS1123_LABEL.match(namespace):
        raise SpecError(f"namespace={namespace!r} is not a valid namespace name")
    if not DNS1123_SUBDOMAIN.match(service_account):
        raise SpecError(f"service_account={service_account!r} is not a valid service account")
    docs: list[dict[str, Any]] = list(yaml.safe_load_all(RBAC_FILE.read_text()))
    for doc in docs:
        if doc["kind"] in ("Role", "RoleBinding"):
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "ClusterRoleBinding":
            doc["metadata"]["name"] = (
                f"kfp-ddp-pytorchjob-launcher-access-review-{namespace}-{service_account}"
            )[:253]
        for subject in doc.get("subjects", []):
            subject["name"] = service_account
            subject["namespace"] = namespace
    return docs


def render_rbac(*, namespace: str = "kubeflow", service_account: str = "pipeline-runner") -> str:
    """rbac.yaml for ``namespace`` / ``service_account`` as YAML text."""
    docs = rbac_documents(namespace=namespace, service_account=service_account)
    return yaml.safe_dump_all(docs, sort_keys=False)
