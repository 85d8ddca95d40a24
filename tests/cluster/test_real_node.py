"""The real node itself: a pod of our image pulled from the loopback registry runs as UID 1000,
its logs come through the API server."""

from __future__ import annotations

import time

import pytest

# One real node serves them all: files named test_real_node* run on one xdist worker
# (tests/node_scheduling.py).
pytestmark = [pytest.mark.node, pytest.mark.slow]


def _wait_phase(api, namespace: str, name: str, phases: tuple[str, ...], timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = api.read_namespaced_pod(name, namespace)
        if pod.status.phase in phases:
            return pod
        time.sleep(0.3)
    raise AssertionError(f"pod {name}: {pod.status.phase} after {timeout} s: {pod.status}")


def _restricted(**extra) -> dict:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        **extra,
    }


def test_a_pod_of_our_image_runs_and_its_log_comes_through_the_api_server(node_cluster, node_k8s):
    from kubernetes import client

    api = client.CoreV1Api(node_k8s.admin())
    pod = {
        "metadata": {"name": "hello"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": node_cluster.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "id; kfp-ddp --help | head -1"],
                    "securityContext": _restricted(runAsUser=1000, runAsGroup=1000),
                }
            ],
        },
    }
    api.create_namespaced_pod(node_k8s.name, pod)
    done = _wait_phase(api, node_k8s.name, "hello", ("Succeeded", "Failed"), timeout=300)
    log = api.read_namespaced_pod_log("hello", node_k8s.name)
    assert done.status.phase == "Succeeded", log
    assert "uid=1000(kfp-ddp)" in log and "Usage: kfp-ddp" in log
    assert done.spec.node_name == node_cluster.node.name  # placed by the real scheduler
    # Pulled this session, by its name in this session's registry: the image store kept between
    # sessions holds no names (tests/cluster/image_store.py), only unpacked layers.
    assert node_cluster.image in node_cluster.node.image_names()
