"""The launcher's API client decodes what the API server sends as the ``kubernetes`` client does,
without a ``Configuration`` per decoded model (clients.py: each one empties every logger's level
cache): a pod read, and a pod event of the launcher's watch. ``benchmarks/k8s_decode.py``
measures what it saves."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes import client

from components.launcher.backends.kubernetes.clients import Clients, model_api_client
from components.launcher.backends.kubernetes.watching import _watch_decoding_as
from components.launcher.options import KubernetesOptions

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "job-worker-0",
        "namespace": "team",
        "uid": "0f" * 16,
        "resourceVersion": "42",
        "labels": {"training.kubeflow.org/job-name": "job"},
        "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}],
    },
    "spec": {
        "initContainers": [{"name": "stage-data", "image": "kfp-ddp:1", "args": ["stage"]}],
        "containers": [
            {
                "name": "pytorch",
                "image": "kfp-ddp:1",
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}},
                ],
                "volumeMounts": [{"name": "stage", "mountPath": "/stage"}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                "securityContext": {"runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [{"name": "stage", "emptyDir": {"sizeLimit": "6Gi"}}],
    },
    "status": {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "pytorch",
                "ready": True,
                "restartCount": 1,
                "image": "kfp-ddp:1",
                "imageID": "sha256:ab",
                "state": {"running": {"startedAt": "2026-11-29T05:00:05Z"}},
                "lastState": {"terminated": {"exitCode": 143, "reason": "Error"}},
            }
        ],
    },
}


@pytest.fixture
def configurations_made(monkeypatch) -> list[int]:
    """Appends to the list each time a ``Configuration`` is made."""
    made: list[int] = []
    original = client.Configuration.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(client.Configuration, "__init__", counting)
    return made


def _decoded(api_client) -> client.V1Pod:
    return api_client.deserialize(SimpleNamespace(data=json.dumps(POD)), "V1Pod")


def test_a_pod_decodes_as_the_stock_client_decodes_it_without_a_configuration_per_model(
    configurations_made,
):
    stock = client.ApiClient(client.Configuration())
    ours = model_api_client(client.Configuration())
    configurations_made.clear()
    expected = _decoded(stock)
    assert len(configurations_made) > 20  # the stock client's way: one per model
    configurations_made.clear()
    pod = _decoded(ours)
    assert configurations_made == []
    assert pod == expected
    assert pod.spec.containers[0].env[1].value_from.secret_key_ref.key == "id"
    assert pod.status.container_statuses[0].last_state.terminated.exit_code == 143
    assert pod.spec.volumes[0].empty_dir.size_limit == "6Gi"
    assert pod.local_vars_configuration is ours.configuration


def test_the_launchers_watch_decodes_its_events_with_the_runs_client(configurations_made):
    clients = Clients.connect(KubernetesOptions(client_configuration=client.Configuration()))
    stream = _watch_decoding_as(clients.core.list_namespaced_pod)
    assert stream._api_client is clients.core.api_client
    line = json.dumps({"type": "MODIFIED", "object": POD})
    configurations_made.clear()
    event = stream.unmarshal_event(line, "V1Pod")
    assert configurations_made == []
    assert event["object"] == _decoded(client.ApiClient(client.Configuration()))
    assert stream.resource_version == "42"
