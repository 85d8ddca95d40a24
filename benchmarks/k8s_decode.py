"""What decoding a pod costs the launcher: the ``kubernetes`` client's own ``ApiClient`` (the
baseline) vs. the launcher's ``ModelApiClient`` (``components/launcher/backends/kubernetes/
clients.py``), side by side in this process.

The pod is one the launcher reads on every pod event of a job: a PyTorchJob worker of our trainer
(rendered by the launcher, with its init container, env, mounts and volumes) plus what the
API server adds (managed fields, conditions, container statuses). The stock client builds a
``Configuration`` per decoded model, and each one empties every logger's level cache, so its cost
grows with the loggers a process has: the rounds are run as the launcher's process has them
(after importing the launcher) and again with ``--loggers`` more (a process that imported more
libraries: a KFP step with kfp and boto3, a test session). Each round decodes the pod ``--pods``
times with each client, alternating, and checks that both decode the same object.

    python benchmarks/k8s_decode.py                 # ~20 s on 2 cores
    python benchmarks/k8s_decode.py --pods 500 --loggers 3000
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from components.launcher.apis import build_manifest  # noqa: E402
from components.launcher.backends.kubernetes.clients import model_api_client  # noqa: E402
from components.launcher.spec import TrainSpec  # noqa: E402

NOW = "2026-11-29T05:00:00Z"
MANAGED_FIELDS = [
    {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": NOW,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:conditions": {}}},
    }
    for manager in ("training-operator", "kube-scheduler", "kubelet")
]


def _status(name: str, running: bool) -> dict:
    """A container's status: running, or (an init container) completed."""
    if running:
        state = {"running": {"startedAt": NOW}}
    else:
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": NOW}}
    return {
        "name": name,
        "ready": running,
        "restartCount": 0,
        "image": "kfp-ddp:test",
        "imageID": "kfp-ddp@sha256:" + "ab" * 32,
        "containerID": "containerd://" + "cd" * 32,
        "started": running,
        "state": state,
    }


def worker_pod() -> dict:
    """A PyTorchJob worker pod of our trainer, as the API server returns it while it runs."""
    spec = TrainSpec.flat(
        api="pytorchjob",
        name="job",
        namespace="team",
        workers=4,
        run_id="run-1",
        stage_data_uri="s3://bucket/data",
        s3_endpoint="http://s3:9000",
        s3_credentials_secret="s3-keys",
        stage_data_bytes=10**9,
        checkpoint_space="10Gi",
    )
    template = build_manifest(spec)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    labels = {**template["metadata"].get("labels", {}), "training.kubeflow.org/replica-index": "1"}
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "job"}
    conditions = ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "job-worker-1",
            "namespace": "team",
            "uid": "0f" * 16,
            "resourceVersion": "12345",
            "creationTimestamp": NOW,
            "labels": labels,
            "annotations": template["metadata"].get("annotations", {}),
            "ownerReferences": [{**owner, "uid": "1e" * 16, "controller": True}],
            "managedFields": MANAGED_FIELDS,
        },
        "spec": {**template["spec"], "nodeName": "node-1"},
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.7",
            "qosClass": "Burstable",
            "startTime": NOW,
            "conditions": [{"type": t, "status": "True"} for t in conditions],
            "initContainerStatuses": [
                _status(c["name"], False) for c in template["spec"].get("initContainers", [])
            ],
            "containerStatuses": [_status(c["name"], True) for c in template["spec"]["containers"]],
        },
    }


def _decode_seconds(api_client, data: str, pods: int) -> tuple[float, object]:
    response = SimpleNamespace(data=data)
    began = time.process_time()
    for _ in range(pods):
        pod = api_client.deserialize(response, "V1Pod")
    return time.process_time() - began, pod


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200, help="decodes per client per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loggers", type=int, default=1000, help="more loggers, second setting")
    args = parser.parse_args()

    from kubernetes import client

    data = json.dumps(worker_pod())
    stock = client.ApiClient(client.Configuration())
    ours = model_api_client(client.Configuration())
    for setting in ("as the launcher's process", f"with {args.loggers} more loggers"):
        if setting.startswith("with"):
            for i in range(args.loggers):
                logging.getLogger(f"benchmark.extra.{i}")
        loggers = len(logging.root.manager.loggerDict)
        ratios = []
        for _ in range(args.rounds):
            base_s, base_pod = _decode_seconds(stock, data, args.pods)
            ours_s, our_pod = _decode_seconds(ours, data, args.pods)
            assert our_pod == base_pod, "the two clients decoded different pods"
            ratios.append(base_s / ours_s)
            print(
                f"{setting} ({loggers} loggers): stock {1000 * base_s / args.pods:.2f} ms a pod, "
                f"ModelApiClient {1000 * ours_s / args.pods:.2f} ms: {base_s / ours_s:.1f}x"
            )
        print(f"{setting}: median {statistics.median(ratios):.1f}x less CPU than the stock client")


if __name__ == "__main__":
    main()
