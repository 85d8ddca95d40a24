"""The API clients of one kubernetes-backend run, from its options (kubeconfig or in-cluster)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.launcher.options import KubernetesOptions
from components.launcher.result import PreflightError


def load_configuration(options: KubernetesOptions) -> Any:
    """``options.client_configuration``, else kubeconfig/in-cluster config as kubectl finds it."""
    from kubernetes import client, config

    if options.client_configuration is not None:
        return options.client_configuration
    try:
        if options.config_file or options.context:
            config.load_kube_config(config_file=options.config_file, context=options.context)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
    except (config.ConfigException, OSError) as exc:
        raise PreflightError(
            f"no Kubernetes credentials: {exc}. Run inside a pod with a service account, or set "
            "KUBECONFIG / config_file"
        ) from exc
    return client.Configuration.get_default_copy()


@dataclass
class Clients:
    """The ``kubernetes`` client APIs a run uses."""

    host: str
    core: Any
    """CoreV1Api: pods, logs, events, namespaces."""
    custom: Any
    """CustomObjectsApi: the jobs, runtimes and API discovery of their groups."""
    authz: Any
    """AuthorizationV1Api: SelfSubjectAccessReviews."""
    batch: Any
    """BatchV1Api: the Jobs a controller made for a job, awaited before it is created again."""

    @classmethod
    def connect(cls, options: KubernetesOptions) -> Clients:
        from kubernetes import client

        configuration = load_configuration(options)
        api = client.ApiClient(configuration)
        return cls(
            host=configuration.host,
            core=client.CoreV1Api(api),
            custom=client.CustomObjectsApi(api),
            authz=client.AuthorizationV1Api(api),
            batch=client.BatchV1Api(api),
        )
