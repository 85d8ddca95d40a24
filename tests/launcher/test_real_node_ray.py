"""A RayJob on the real node, as users run it: the real KubeRay operator, the launcher's
ServiceAccount with the rendered Role, a namespace enforcing ``restricted``, our image with the
``ray`` extra pulled from the loopback registry. The Ray head and 2 worker pods start (each
worker staging the data set from S3 in its init container), KubeRay's submitter runs ``ray job
submit`` once they are ready, and our trainer trains under Ray Train as 2 workers, one per pod;
the launcher follows the pods' logs to the end.

Both RayJobs (the one that trains to the end, the one whose worker pod is deleted) start
together, each in a namespace of its own (node_runs.py): a Ray cluster's start waits in places
(KubeRay's GCS wait, the readiness probes, the submitter), which the other job fills. The two keep
the node's 2 CPUs busy, so the gain is small (node_runs.py has the numbers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from components.launcher import JobFailed, job_api
from components.launcher.backends.kubernetes import granted_permissions
from components.launcher.rayjob import JOB_LABEL
from tests.cluster.plugin import Namespace
from tests.containers.example_images import ray_image
from tests.containers.layouts import oci_layout
from tests.launcher.k8s_helpers import OPTIONAL_READS, calls, jobs, refused
from tests.launcher.node_runs import SHARED_CPU, NodeRun, Planned, started_together
from tests.launcher.test_real_node_jobs import (
    _checkpoints,
    _summary,
    _wait_for,
    s3_secret,
    trainer_spec,
    upload_dataset,
)

pytestmark = [pytest.mark.node, pytest.mark.slow]

RAY_HEAD_CPU = "100m"
"""The head's CPU request here (it trains nothing): with SHARED_CPU workers and KubeRay's
submitter, both jobs' pods fit the node's 2 CPUs together."""
NEVER = ["--checkpoint-every-steps", "100000"]
"""The stopped job checkpoints only when stopped: a checkpoint in S3 can only be the stop's."""


@pytest.fixture(scope="module")
def ray_image_pushed(podman, cpu_image, oci_registry, tmp_path_factory) -> str:
    built = ray_image(podman, cpu_image, tmp_path_factory.mktemp("ray-image"))
    return oci_registry.push_oci_layout(oci_layout(podman, built), "kfp-ddp-ray:test")


def _plan(node_cluster, image: str, folder, *, name: str, extra: list[str], **launch):
    """Our trainer as a RayJob of 2 worker pods on ``image``, on a data set of its own;
    ``launch``: the launcher's options besides its timeout."""

    def planned(ns: Namespace) -> Planned:
        s3_secret(ns, node_cluster.s3)
        dataset = upload_dataset(node_cluster, folder / name)
        job = trainer_spec(
            ns,
            "rayjob",
            node_cluster,
            dataset,
            image=image,
            name=name,
            cpu_request=SHARED_CPU,
            memory_request="2Gi",
            ray_head_cpu=RAY_HEAD_CPU,
            env={"OMP_NUM_THREADS": "1"},
            extra=extra,
        )
        return Planned(job, {"timeout_s": 600, **launch}, dataset)

    return planned


@pytest.fixture(scope="module")
def ray_runs(
    node_cluster_for_module, ray_image_pushed, tmp_path_factory
) -> Iterator[dict[str, NodeRun]]:
    """The RayJob that trains to the end and the one stopped mid-training, started together."""
    node_cluster = node_cluster_for_module
    folder = tmp_path_factory.mktemp("ray-data")
    stopped = ["--epochs", "300", "--stop-check-every-steps", "1", *NEVER]
    plans: dict[str, Callable[[Namespace], Planned]] = {
        "ray-stop": _plan(node_cluster, ray_image_pushed, folder, name="ray-stop", extra=stopped),
        # its pods kept for the test to read (cleanup="never")
        "ray": _plan(node_cluster, ray_image_pushed, folder, name="job", extra=[], cleanup="never"),
    }
    with started_together(node_cluster, plans) as runs:
        yield runs


def _worker_pods(run: NodeRun) -> list:
    core = client.CoreV1Api(run.ns.admin())
    selector = f"{JOB_LABEL}={run.job.name},ray.io/node-type=worker"
    return core.list_namespaced_pod(run.ns.name, label_selector=selector).items


def test_a_deleted_ray_worker_pod_checkpoints_and_the_step_can_be_retried(node_cluster, ray_runs):
    """A Ray worker pod deleted mid-training (preemption, a drained node): its SIGTERM never
    reaches the trainer (PID 1 is ``ray start``), so its ``preStop`` hook creates the stop file;
    every rank stops at the same step, rank 0 checkpoints to S3, the trainers exit 143 and so
    does the Ray job: a failure the launcher does not record as permanent, so a retry of the
    step resumes from that checkpoint."""
    run = ray_runs["ray-stop"]
    lines = run.lines
    future = run.outcome
    _wait_for(lambda: future.done() or any("| loss " in x for x in lines), 300, "training")
    assert not future.done(), run.log[-3000:]
    (first, *_) = _worker_pods(run)
    client.CoreV1Api(run.ns.admin()).delete_namespaced_pod(first.metadata.name, run.ns.name)
    error = run.failure(timeout=300)
    assert isinstance(error, JobFailed), error
    assert "exit code 143" in str(error), f"{error}\n{run.log[-4000:]}"
    (kept,) = [j for j in jobs(run.ns, "rayjob") if j["metadata"]["name"] == run.job.name]
    assert not job_api("rayjob").permanent_failure(kept)  # a retry runs it again
    stopped = _checkpoints(node_cluster, run.dataset)
    assert len(stopped) == 1, (stopped, run.log[-4000:])  # the stop's, mid-training


def test_our_trainer_trains_under_ray_train_on_two_worker_pods(node_cluster, ray_runs):
    run = ray_runs["ray"]
    result = run.outcome.result(timeout=600)
    log = run.log
    assert result.phase == "Succeeded", f"{result.reason}\n{log[-8000:]}"
    # Each worker pod staged the data set from S3 in its init container (the head none).
    workers = _worker_pods(run)
    assert len(workers) == 2
    core = client.CoreV1Api(run.ns.admin())
    for pod in workers:
        name = pod.metadata.name
        staged = core.read_namespaced_pod_log(name, run.ns.name, container="stage-data")
        assert "stage: transferred 36 of 36 files" in staged, staged[-3000:]
    # The launcher followed the Ray pods' logs: the head's, and the submitter's (the Ray job's,
    # carrying the driver's and the workers' output).
    assert "[head-0]" in log, log[-4000:]
    assert "[submitter]" in log and "[ray_train] done: the trainer exited 0 on all 2 workers" in log
    summary = _summary(node_cluster, run.dataset)
    assert summary["world_size"] == 2 and summary["steps"] > 0
    assert summary["replicas_in_sync"] is True
    # The model and the checkpoints are in S3, as with the other APIs.
    bucket = run.dataset.removeprefix("s3://")
    keys = [o["Key"] for o in node_cluster.s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "run/output/model/weights.pt" in keys
    assert any(k.startswith("run/checkpoints/step-") and k.endswith("/COMPLETE") for k in keys)
    assert refused(run.ns) <= OPTIONAL_READS, refused(run.ns)
    assert calls(run.ns) - OPTIONAL_READS <= granted_permissions()
