"""A RayJob on the real node, as users run it: the real KubeRay operator, the launcher's
ServiceAccount with the rendered Role, a namespace enforcing ``restricted``, our image with the
``ray`` extra pulled from the loopback registry. The Ray head and 2 worker pods start (each
worker staging the data set from S3 in its init container), KubeRay's submitter runs ``ray job
submit`` once they are ready, and our trainer trains under Ray Train as 2 workers, one per pod;
the launcher follows the pods' logs to the end."""

from __future__ import annotations

import pytest
from kubernetes import client

from components.launcher import JobFailed, job_api, run_job
from components.launcher.backends.kubernetes import granted_permissions
from components.launcher.rayjob import JOB_LABEL
from tests.launcher.k8s_helpers import OPTIONAL_READS, calls, jobs, options, refused
from tests.launcher.node_runs import in_background
from tests.launcher.test_real_node_jobs import (
    _checkpoints,
    _summary,
    _wait_for,
    dataset,
    s3_secret,
    trainer_spec,
)

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.node_image("ray")]
__all__ = ["dataset"]  # the fixture, shared with the other real-node jobs


@pytest.fixture(scope="module")
def ray_image_pushed(node_cluster_for_module) -> str:
    return node_cluster_for_module.images.pushed("ray")


def _ray_job(node_cluster, node_k8s, image: str, dataset: str, **kw):
    """Our trainer as a RayJob of 2 worker pods on ``image``, reading the S3 keys' Secret."""
    s3_secret(node_k8s, node_cluster.s3)
    return trainer_spec(
        node_k8s,
        "rayjob",
        node_cluster,
        dataset,
        image=image,
        memory_request="2Gi",
        env={"OMP_NUM_THREADS": "1"},
        **kw,
    )


def test_our_trainer_trains_under_ray_train_on_two_worker_pods(
    node_cluster, node_k8s, ray_image_pushed, dataset
):
    job = _ray_job(node_cluster, node_k8s, ray_image_pushed, dataset)
    lines: list[str] = []
    kept = options(node_k8s, lines, timeout_s=600, cleanup="never")  # its pods: read below
    result = run_job(job, backend="kubernetes", options=kept)
    log = "\n".join(lines)
    assert result.phase == "Succeeded", f"{result.reason}\n{log[-8000:]}"
    # Each worker pod staged the data set from S3 in its init container (the head none).
    core = client.CoreV1Api(node_k8s.admin())
    workers = core.list_namespaced_pod(
        node_k8s.name, label_selector=f"{JOB_LABEL}={job.name},ray.io/node-type=worker"
    ).items
    assert len(workers) == 2
    for pod in workers:
        staged = core.read_namespaced_pod_log(
            pod.metadata.name, node_k8s.name, container="stage-data"
        )
        assert "stage: transferred 36 of 36 files" in staged, staged[-3000:]
    # The launcher followed the Ray pods' logs: the head's, and the submitter's (the Ray job's,
    # carrying the driver's and the workers' output).
    assert "[head-0]" in log, log[-4000:]
    assert "[submitter]" in log and "[ray_train] done: the trainer exited 0 on all 2 workers" in log
    summary = _summary(node_cluster, dataset)
    assert summary["world_size"] == 2 and summary["steps"] > 0
    assert summary["replicas_in_sync"] is True
    # The model and the checkpoints are in S3, as with the other APIs.
    bucket = dataset.removeprefix("s3://")
    keys = [o["Key"] for o in node_cluster.s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "run/output/model/weights.pt" in keys
    assert any(k.startswith("run/checkpoints/step-") and k.endswith("/COMPLETE") for k in keys)
    assert refused(node_k8s) <= OPTIONAL_READS, refused(node_k8s)
    assert calls(node_k8s) - OPTIONAL_READS <= granted_permissions()


def test_a_deleted_ray_worker_pod_checkpoints_and_the_step_can_be_retried(
    node_cluster, node_k8s, ray_image_pushed, dataset
):
    """A Ray worker pod deleted mid-training (preemption, a drained node): its SIGTERM never
    reaches the trainer (PID 1 is ``ray start``), so its ``preStop`` hook creates the stop file;
    every rank stops at the same step, rank 0 checkpoints to S3, the trainers exit 143 and so
    does the Ray job: a failure the launcher does not record as permanent, so a retry of the
    step resumes from that checkpoint."""
    never = ["--checkpoint-every-steps", "100000"]  # a checkpoint in S3 can only be the stop's
    job = _ray_job(
        node_cluster,
        node_k8s,
        ray_image_pushed,
        dataset,
        extra=["--epochs", "300", "--stop-check-every-steps", "1", *never],
        name="ray-stop",
    )
    lines: list[str] = []
    future = in_background(
        run_job, job, backend="kubernetes", options=options(node_k8s, lines, timeout_s=600)
    )
    _wait_for(lambda: future.done() or any("| loss " in x for x in lines), 300, "training")
    assert not future.done(), "\n".join(lines)[-3000:]
    core = client.CoreV1Api(node_k8s.admin())
    (first, *_) = core.list_namespaced_pod(
        node_k8s.name, label_selector=f"{JOB_LABEL}={job.name},ray.io/node-type=worker"
    ).items
    core.delete_namespaced_pod(first.metadata.name, node_k8s.name)
    with pytest.raises(JobFailed) as err:
        future.result(timeout=300)
    log = "\n".join(lines)
    assert "exit code 143" in str(err.value), f"{err.value}\n{log[-4000:]}"
    (kept,) = [j for j in jobs(node_k8s, "rayjob") if j["metadata"]["name"] == job.name]
    assert not job_api("rayjob").permanent_failure(kept)  # a retry runs it again
    stopped = _checkpoints(node_cluster, dataset)
    assert len(stopped) == 1, (stopped, log[-4000:])  # the stop's, mid-training
