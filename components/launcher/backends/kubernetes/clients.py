"""The API clients of one kubernetes-backend run, from its options (kubeconfig or in-cluster).

Their objects (pods above all: the launcher reads every pod event of a job) are decoded by
:class:`ModelApiClient`, which gives each decoded model the client's configuration. The
``kubernetes`` client we pin (v30) gives none, so each model it decodes (a pod is ~100: its
containers, their env vars, mounts, statuses, managed fields) builds a ``Configuration`` of its
own, whose ``debug`` setter calls ``setLevel`` on two loggers: each such call empties the level
cache of *every* logger in the process under the logging lock (kubernetes-client/python#1867,
#2284). Measured by ``benchmarks/k8s_decode.py``.
"""

from __future__ import annotations

import functools
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


@functools.cache
def _model_api_client_class() -> type:
    from kubernetes import client

    class ModelApiClient(client.ApiClient):
        """An ``ApiClient`` whose decoded models share its configuration (module docstring)."""

        # ApiClient.__deserialize_model, as its name-mangled self.__deserialize_model calls it.
        def _ApiClient__deserialize_model(self, data: Any, klass: Any) -> Any:  # noqa: N802
            types = getattr(klass, "openapi_types", None)
            if not isinstance(data, dict) or not types or hasattr(klass, "get_real_child_model"):
                return super()._ApiClient__deserialize_model(data, klass)
            fields = klass.attribute_map
            decoded = {
                attr: self._ApiClient__deserialize(data[fields[attr]], kind)
                for attr, kind in types.items()
                if fields[attr] in data
            }
            return klass(**decoded, local_vars_configuration=self.configuration)

    return ModelApiClient


def model_api_client(configuration: Any) -> Any:
    """A :class:`ModelApiClient` of ``configuration``."""
    return _model_api_client_class()(configuration)


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
        api = model_api_client(configuration)
        return cls(
            host=configuration.host,
            core=client.CoreV1Api(api),
            custom=client.CustomObjectsApi(api),
            authz=client.AuthorizationV1Api(api),
            batch=client.BatchV1Api(api),
        )
