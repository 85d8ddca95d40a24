"""The pipeline's exit handler: delete a run's jobs that are still running (a cancelled or failed
run must not keep GPUs busy), of each API the cluster serves. A job that already failed is kept for
inspection (its pods hold the logs); a PyTorchJob's TTL removes it later."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.launcher.apis import JOB_APIS, JobApi
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.backends.kubernetes.discovery import serves
from components.launcher.backends.kubernetes.submit import delete_job
from components.launcher.names import RUN_ID_LABEL, label_safe
from components.launcher.options import KubernetesOptions


def delete_run_jobs(
    namespace: str,
    run_id: str,
    *,
    options: KubernetesOptions | None = None,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Delete the jobs (TrainJob, PyTorchJob, TFJob) labelled with ``run_id`` in ``namespace``,
    but for those that failed (kept for inspection).

    Returns ``KIND/NAME`` of the jobs deleted (a job gone meanwhile is not counted).
    """
    options = options or KubernetesOptions()
    note = log or options.log or print
    clients = Clients.connect(options)
    deleted = []
    for api in JOB_APIS.values():
        if not serves(clients, api):
            continue
        for item in _run_jobs(clients, api, namespace, run_id, note):
            name = item["metadata"]["name"]
            if api.phase(item).phase == "Failed" or api.permanent_failure(item):
                note(
                    f"kept failed {api.kind} {namespace}/{name} for inspection (kubectl delete "
                    f"{api.kind.lower()} -n {namespace} {name})"
                )
                continue
            if delete_job(clients, api, namespace, name, f"run {run_id} ended", note):
                deleted.append(f"{api.kind}/{name}")
    return deleted


def _run_jobs(
    clients: Clients, api: JobApi, namespace: str, run_id: str, note: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The run's jobs of ``api``; none, with a note, when the Role may not list them (a Role
    applied before that API was added to rbac.yaml): one kind never stops the cleanup of the
    others."""
    from kubernetes.client.rest import ApiException

    try:
        jobs = clients.custom.list_namespaced_custom_object(
            api.group,
            api.version,
            namespace,
            api.plural,
            label_selector=f"{RUN_ID_LABEL}={label_safe(run_id)}",
        )
    except ApiException as exc:
        if exc.status != 403:
            raise
        note(
            f"may not list {api.plural} in {namespace!r} (HTTP 403): not cleaned up; apply the "
            "current components/launcher/rbac.yaml (python -m components.launcher rbac)"
        )
        return []
    return jobs.get("items", [])
