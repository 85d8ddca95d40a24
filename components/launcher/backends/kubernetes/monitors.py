"""Create a job's monitoring objects (``metrics_port``) beside it, owned by it.

The PodMonitor (or Service + ServiceMonitor) and PrometheusRule of ``components.launcher.
monitoring`` are created right after the job, each with an ``ownerReference`` to it: when the job
is deleted (by the launcher's cleanup, the pipeline's exit handler, the operator's TTL or by
hand), Kubernetes' garbage collector deletes them too. Monitoring never fails a training: a
cluster without the Prometheus Operator (HTTP 404), a Role without the monitoring rules (403) or
any other refusal is noted, and the job trains on (its pods still carry the scrape annotations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.launcher import monitoring
from components.launcher.apis import JobApi
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.monitoring_documents import monitoring_documents
from components.launcher.spec import TrainSpec


def owner_reference(api: JobApi, job: dict[str, Any]) -> dict[str, Any]:
    """The reference that makes ``job`` the owner (no blockOwnerDeletion: that would need more
    RBAC, and nothing waits for these objects)."""
    metadata = job["metadata"]
    return {
        "apiVersion": api.group_version,
        "kind": api.kind,
        "name": metadata["name"],
        "uid": metadata["uid"],
    }


def create_monitors(
    clients: Clients,
    spec: TrainSpec,
    api: JobApi,
    job: dict[str, Any] | None,
    note: Callable[[str], None],
) -> list[str]:
    """Create ``spec``'s monitoring documents owned by ``job``; returns ``KIND/NAME`` created."""
    documents = monitoring_documents(spec)
    if not documents:
        return []
    if not job or not (job.get("metadata") or {}).get("uid"):
        note("the job has no uid to own its monitoring objects: none created")
        return []
    created = []
    for document in documents:
        document["metadata"]["ownerReferences"] = [owner_reference(api, job)]
        title = f"{document['kind']} {spec.namespace}/{document['metadata']['name']}"
        problem = _create(clients, spec.namespace, document)
        if problem is None:
            created.append(f"{document['kind']}/{document['metadata']['name']}")
            note(f"created {title} (deleted with the job)")
        else:
            note(f"{title} not created: {problem}")
    return created


def _create(clients: Clients, namespace: str, document: dict[str, Any]) -> str | None:
    """Create one document; None when it exists now, else why not (with the fix)."""
    from kubernetes.client.rest import ApiException

    kind = document["kind"]
    try:
        if kind == "Service":
            clients.core.create_namespaced_service(namespace, document)
        else:
            clients.custom.create_namespaced_custom_object(
                monitoring.GROUP, monitoring.VERSION, namespace, monitoring.PLURALS[kind], document
            )
    except ApiException as exc:
        if exc.status == 409:
            return None  # a re-attached job's, created by the first attempt
        if exc.status == 404:
            return (
                f"the cluster serves no {monitoring.API_VERSION} {kind} (install the Prometheus "
                "Operator, or scrape the pods by their prometheus.io annotations)"
            )
        if exc.status == 403:
            return (
                f"forbidden (HTTP 403): apply the current components/launcher/rbac.yaml "
                f"(python -m components.launcher rbac), which grants creating {kind}s"
            )
        return f"HTTP {exc.status} {exc.reason}: {str(exc.body or '')[:300]}"
    return None
