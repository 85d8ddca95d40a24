"""Which training APIs the cluster serves, and the one ``api="auto"`` picks.

Asks the API server's discovery for each group/version (``GET /apis/<group>/<version>``, which
every authenticated user may read) and looks for the job resource in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.launcher.apis import AUTO_APIS, JobApi, job_api
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.result import PreflightError


@dataclass(frozen=True)
class ApiChoice:
    """The API a job is submitted with, and why."""

    api: JobApi
    why: str


def serves(clients: Clients, api: JobApi) -> bool:
    """Whether the cluster serves ``api``'s job resource."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        resources = clients.custom.get_api_resources(api.group, api.version)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise PreflightError(f"API discovery of {api.group_version} failed: {exc}") from exc
    except HTTPError as exc:
        raise PreflightError(f"cannot reach the Kubernetes API at {clients.host}: {exc}") from exc
    return any(r.name == api.plural for r in (resources.resources or []))


def choose_api(clients: Clients, requested: str) -> ApiChoice:
    """The API to submit with: ``requested``, or for ``auto`` the first the cluster serves."""
    if requested != "auto":
        api = job_api(requested)
        if serves(clients, api):
            return ApiChoice(api, f"api={requested} was asked for")
        # Only the APIs that run the same program: a TFJob's TensorFlow program has none.
        same_program = AUTO_APIS if api in AUTO_APIS else ()
        others = [a.name for a in same_program if a is not api and serves(clients, a)]
        alternative = f"; it serves {others[0]}: use api={others[0]} or api=auto" if others else ""
        raise PreflightError(
            f"the {api.kind} CRD ({api.plural}.{api.group_version}) is not installed on the "
            f"cluster at {clients.host}{alternative}. Or {api.install}"
        )
    for index, api in enumerate(AUTO_APIS):
        if serves(clients, api):
            skipped = [a.group_version for a in AUTO_APIS[:index]]
            why = f"api=auto: the cluster serves {api.group_version} {api.plural}"
            if skipped:
                why += f" (not {', '.join(skipped)})"
            return ApiChoice(api, why)
    raise PreflightError(
        f"api=auto: the cluster at {clients.host} serves neither Kubeflow Trainer v2 TrainJobs "
        "(trainer.kubeflow.org/v1alpha1) nor Training Operator v1 PyTorchJobs (kubeflow.org/v1): "
        + "; or ".join(a.install for a in AUTO_APIS)
    )
