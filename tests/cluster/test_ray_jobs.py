"""Our RayJob turned into pods by the real KubeRay operator v1.7.0, every pod admitted under
``restricted`` Pod Security: a RayCluster with a head pod and a worker group (KubeRay's
``wait-gcs-ready`` init container included), then, once those are ready, the submitter Job from
our template, which runs ``ray job submit`` with our entrypoint; and the launcher itself, as
its ServiceAccount with the rendered Role: it submits, follows and, at its timeout, deletes the
RayJob."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from components.launcher import JobFailed, JobTimeout, TrainSpec, build_rayjob, job_api
from components.launcher.rayjob import CONTAINER, JOB_LABEL
from tests.cluster.play import created_pods
from tests.launcher.k8s_helpers import (
    OPTIONAL_READS,
    calls,
    jobs,
    kubeconfig_of,
    options,
    play_rayjob_status,
    refused,
    run,
)

REPO = Path(__file__).resolve().parents[2]

IMAGE = "registry.example.com/team/kfp-ddp-ray:1"


@pytest.fixture
def restricted(cluster, request):
    name = cluster.create_namespace(request.node.name, pod_security="restricted")
    yield name
    cluster.clear_namespace(name)


def _spec(namespace: str, **kw) -> TrainSpec:
    base = {
        "api": "rayjob",
        "name": "ray",
        "namespace": namespace,
        "workers": 2,
        "nproc_per_node": 2,
        "run_id": "r",
        "image": IMAGE,
        "cpu_request": "2",
        "memory_request": "4Gi",
        "stage_data_uri": "s3://bucket/data",
        "args": ["--epochs", "1"],
    }
    return TrainSpec.flat(**(base | kw))


def test_a_rayjob_becomes_a_head_workers_and_the_submitter_all_restricted(cluster, restricted):
    spec = _spec(restricted)
    client.CustomObjectsApi(cluster.clients()).create_namespaced_custom_object(
        "ray.io", "v1", restricted, "rayjobs", build_rayjob(spec), field_validation="Strict"
    )
    (head,) = created_pods(cluster, restricted, "ray.io/node-type=head", 1)
    workers = created_pods(cluster, restricted, "ray.io/node-type=worker", 2)
    for pod in [head, *workers]:
        assert pod.metadata.labels[JOB_LABEL] == "ray"
        (container,) = pod.spec.containers
        assert container.name == CONTAINER and container.image == IMAGE
        assert "ray start" in " ".join(container.args or [])  # KubeRay's command
        assert container.security_context.read_only_root_filesystem is True
        assert pod.spec.security_context.run_as_non_root is True
    (ray,) = head.spec.containers
    assert "--num-cpus=0" in " ".join(ray.args)  # the head trains nothing
    assert not [c for c in head.spec.init_containers or [] if c.name == "stage-data"]
    for pod in workers:
        (ray,) = pod.spec.containers
        assert "--num-cpus=2" in " ".join(ray.args)  # nproc_per_node Ray Train workers
        init = [c.name for c in pod.spec.init_containers]
        assert init[0] == "stage-data" and "wait-gcs-ready" in init  # KubeRay's, admitted too
    for pod in [head, *workers]:
        cluster.kubelet.run(pod)  # Running and Ready: KubeRay then submits
    (submitter,) = created_pods(cluster, restricted, "ray.io/originated-from-crd=RayJob", 1)
    (container,) = submitter.spec.containers
    script = " ".join([*(container.command or []), *(container.args or [])])
    assert "ray job submit" in script
    assert (
        "-- python -m trainer.ray_train --workers 4 --cpus-per-worker 1 --gpus-per-worker 0 "
        "--name ray -- --epochs 1"
    ) in script
    assert container.security_context.allow_privilege_escalation is False
    assert submitter.spec.security_context.run_as_non_root is True
    assert {e.name for e in container.env} >= {"RAY_DASHBOARD_ADDRESS", "RAY_JOB_SUBMISSION_ID"}
    job = client.CustomObjectsApi(cluster.clients()).get_namespaced_custom_object(
        "ray.io", "v1", restricted, "rayjobs", "ray"
    )
    assert job["status"]["jobDeploymentStatus"] in ("Initializing", "Running")


def test_the_launcher_submits_follows_and_at_its_timeout_deletes_the_rayjob(k8s):
    """As the launcher's ServiceAccount (the rendered Role): the Ray cluster never reports the
    job done here (its dashboard is not reachable from the operator), so the launcher's timeout
    ends it, deleting the RayJob; every call it made is one the Role grants."""
    spec = _spec(k8s.name, workers=1, nproc_per_node=1)
    lines: list[str] = []
    with pytest.raises(JobTimeout):
        from components.launcher import run_job

        run_job(spec, backend="kubernetes", options=options(k8s, lines, timeout_s=8))
    assert jobs(k8s, "rayjob") == [] or all(
        j["metadata"].get("deletionTimestamp") for j in jobs(k8s, "rayjob")
    ), "\n".join(lines)
    from components.launcher.backends.kubernetes import granted_permissions

    assert refused(k8s) <= OPTIONAL_READS, refused(k8s)
    assert calls(k8s) - OPTIONAL_READS <= granted_permissions()


CANCEL_SCRIPT = """
import sys
from components.launcher import JobCancelled, KubernetesOptions, TrainSpec, run_job

namespace, kubeconfig, image = sys.argv[1:4]
spec = TrainSpec.flat(
    api="rayjob", name="ray", namespace=namespace, workers=1, run_id="r", image=image
)
try:
    run_job(spec, backend="kubernetes", options=KubernetesOptions(config_file=kubeconfig))
except JobCancelled as exc:
    print("CANCELLED:", exc, flush=True)
    sys.exit(143)
"""


def test_a_cancelled_step_deletes_its_rayjob_and_exits_143(k8s, tmp_path: Path):
    """The pipeline run cancelled: SIGTERM to the launcher deletes the RayJob (KubeRay then
    deletes its Ray cluster), and the step exits 143."""
    script = tmp_path / "launch.py"
    script.write_text(CANCEL_SCRIPT)
    kubeconfig = kubeconfig_of(k8s.launcher_configuration(), tmp_path / "kubeconfig")
    proc = subprocess.Popen(
        [sys.executable, str(script), k8s.name, str(kubeconfig), IMAGE],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        created_pods(k8s.cluster, k8s.name, "ray.io/node-type=head", 1)  # the Ray cluster is up
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert f"deleted RayJob {k8s.name}/ray (cancelled (SIGTERM))" in out, out
    deadline = time.monotonic() + 30
    while [j for j in jobs(k8s, "rayjob") if not j["metadata"].get("deletionTimestamp")]:
        assert time.monotonic() < deadline, "the RayJob is still there"
        time.sleep(0.2)


@pytest.mark.parametrize(("code", "permanent"), [(2, True), (200, False)])
def test_a_failed_ray_program_is_permanent_by_its_exit_code_in_the_rayjobs_status(
    k8s, code, permanent
):
    """The driver runs in no pod of its own: the code comes from KubeRay's message (2: bad
    flags, recorded so that a retry fails at once; 200: a lost worker, retried)."""
    failed = {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "reason": "AppFailed",
        "message": f"Job entrypoint command failed with exit code {code}, last available logs: x",
    }
    play_rayjob_status(k8s, "ray", failed)
    with pytest.raises(JobFailed, match=f"exit code {code}"):
        run(k8s, _spec(k8s.name, workers=1, nproc_per_node=1))
    (job,) = jobs(k8s, "rayjob")
    assert bool(job_api("rayjob").permanent_failure(job)) is permanent


def test_a_permanent_code_stops_kuberays_retries_and_the_steps(k8s):
    """With ``backoff_limit`` left KubeRay would run a bad flag again on a new Ray cluster: the
    status it writes once the Ray job failed (as KubeRay v1.7.0 wrote it on the real node, the
    deployment still Running) has the launcher suspend the RayJob and record why; a retry of
    the step then fails at once, creating nothing."""
    failed = {
        "jobDeploymentStatus": "Running",
        "jobStatus": "FAILED",
        "failed": 0,
        "message": "Job entrypoint command failed with exit code 2, last available logs: x",
    }
    spec = _spec(k8s.name, workers=1, nproc_per_node=1, backoff_limit=1)
    play_rayjob_status(k8s, "ray", failed)
    lines: list[str] = []
    with pytest.raises(JobFailed, match="permanent code 2; not retried"):
        run(k8s, spec, lines, timeout_s=60)  # without the launcher's stop it would wait on
    (job,) = jobs(k8s, "rayjob")
    assert job["spec"]["suspend"] is True  # KubeRay deletes the cluster and starts none
    assert "permanent code 2" in job_api("rayjob").permanent_failure(job)
    with pytest.raises(JobFailed, match="failed for good") as again:
        run(k8s, spec, lines)
    assert "nothing allocated" in str(again.value)
    assert sum("created RayJob" in line for line in lines) == 1, lines
