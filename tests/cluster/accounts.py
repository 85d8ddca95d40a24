"""A ServiceAccount the launcher runs as: bound to the Role ``components.launcher.rbac`` renders,
its token from the TokenRequest API. Never admin: a rule missing from the Role fails the test."""

from __future__ import annotations

import time
from typing import Any

from components.launcher.rbac import rbac_documents


def service_account_token(plane: Any, namespace: str, name: str, seconds: int = 3600) -> str:
    """A token of ``namespace/name`` (created if missing), as the kubelet would project it."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(plane.admin_client())
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    )
    answer = core.create_namespaced_service_account_token(name, namespace, request)
    return answer.status.token


def token_configuration(plane: Any, token: str) -> Any:
    """A ``kubernetes`` client Configuration that authenticates with ``token``."""
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = plane.url
    configuration.ssl_ca_cert = str(plane.ca_file)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return configuration


def wait_until_allowed(configuration: Any, namespace: str, group: str, resource: str, verb: str):
    """RBAC takes effect once the API server's authorizer saw the binding (milliseconds)."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(client.ApiClient(configuration))
    name, _, subresource = resource.partition("/")
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace,
                group=group,
                resource=name,
                subresource=subresource or None,
                verb=verb,
            )
        )
    )
    deadline = time.monotonic() + 10
    while not authz.create_self_subject_access_review(review).status.allowed:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{verb} {resource} never became allowed in {namespace}")
        time.sleep(0.05)


def launcher_configuration(
    plane: Any,
    namespace: str,
    *,
    service_account: str = "pipeline-runner",
    documents: list[dict[str, Any]] | None = None,
) -> Any:
    """A client Configuration of ``service_account``, bound to the rendered launcher Role (or to
    ``documents``, e.g. a Role missing a rule)."""
    roles = (
        documents
        if documents is not None
        else rbac_documents(namespace=namespace, service_account=service_account)
    )
    plane.apply(roles)
    configuration = token_configuration(
        plane, service_account_token(plane, namespace, service_account)
    )
    for rule in (r for doc in roles if doc["kind"] == "Role" for r in doc["rules"][:1]):
        wait_until_allowed(
            configuration, namespace, rule["apiGroups"][0], rule["resources"][0], rule["verbs"][0]
        )
    return configuration
