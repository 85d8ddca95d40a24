"""The RayJob of a spec, pure: against KubeRay v1.7.0's CRD (strict), its head, worker group,
submitter and entrypoint, and what a spec of ``api="rayjob"`` refuses, naming the setting."""

from __future__ import annotations

import shlex

import pytest

from components.launcher import RayJobOptions, SpecError, TrainSpec, build_manifest, build_rayjob
from components.launcher.apis import RAYJOB
from tests.crds import schema_errors


def ray_spec(**kw) -> TrainSpec:
    base = {"api": "rayjob", "name": "ray", "namespace": "team", "workers": 3, "run_id": "r"}
    base["image"] = "registry.example.com/ray:1"  # with Ray: the default image is refused
    return TrainSpec.flat(**(base | kw))


def _pods(manifest):
    cluster = manifest["spec"]["rayClusterSpec"]
    (group,) = cluster["workerGroupSpecs"]
    return cluster["headGroupSpec"], group


def test_our_trainer_as_a_rayjob_is_valid_and_says_everything_kuberay_needs():
    spec = ray_spec(
        nproc_per_node=2,
        gpus_per_worker=2,
        cpu_request="8",
        memory_request="32Gi",
        stage_data_uri="s3://bucket/data",
        args=["--epochs", "3"],
        active_deadline_seconds=3600,
    )
    manifest = build_rayjob(spec)
    assert schema_errors("rayjob", manifest) == []
    assert build_manifest(spec) == manifest
    body = manifest["spec"]
    assert body["submissionMode"] == "K8sJobMode" and body["shutdownAfterJobFinishes"] is True
    assert body["backoffLimit"] == 0 and body["activeDeadlineSeconds"] == 3600
    assert body["ttlSecondsAfterFinished"] == 60  # a finished job's pods hold no GPU for long
    assert shlex.split(body["entrypoint"]) == [
        *("python", "-m", "trainer.ray_train", "--workers", "6", "--cpus-per-worker", "1"),
        *("--gpus-per-worker", "1", "--name", "ray", "--", "--epochs", "3", "--device", "cuda"),
    ]
    head, group = _pods(manifest)
    assert head["rayStartParams"]["num-cpus"] == "0"  # the head trains nothing
    (head_ray,) = head["template"]["spec"]["containers"]
    assert "initContainers" not in head["template"]["spec"]  # no data staged on the head
    assert "nvidia.com/gpu" not in str(head_ray["resources"])
    assert [v["name"] for v in head["template"]["spec"]["volumes"]].count("staged-data") == 0
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    assert group["rayStartParams"] == {"num-cpus": "2"}
    (ray,) = group["template"]["spec"]["containers"]
    assert ray["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "command" not in ray and "args" not in ray  # KubeRay's ray start
    assert group["template"]["spec"]["initContainers"][0]["name"] == "stage-data"
    for container in (head_ray, ray):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        # GETs the kubelet makes: no wget, no process in the pod at every check
        assert (
            "exec" not in container["readinessProbe"] and "exec" not in container["livenessProbe"]
        )
        assert container["livenessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}
        # asked from the start and often: KubeRay submits the job once every pod is ready
        assert container["readinessProbe"]["initialDelaySeconds"] <= 2
        assert container["readinessProbe"]["periodSeconds"] <= 2
    assert ray["readinessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}
    # the head is ready when its dashboard serves: the job is submitted there
    assert head_ray["readinessProbe"]["httpGet"] == {"path": "/api/gcs_healthz", "port": 8265}
    submitter = body["submitterPodTemplate"]["spec"]
    (container,) = submitter["containers"]
    assert submitter["restartPolicy"] == "Never" and "command" not in container
    assert not [e for e in container["env"] if "valueFrom" in e]  # no secret in the submitter
    assert submitter["securityContext"]["runAsNonRoot"] is True
    for pod in (head["template"], group["template"], body["submitterPodTemplate"]):
        assert pod["metadata"]["labels"][RAYJOB.pod_job_label] == "ray"


def test_the_users_ray_program_is_the_entrypoint_and_options_land_in_the_rayjob():
    spec = ray_spec(
        image="registry.example.com/team/ray:1",
        command=["python", "/app/tune.py"],
        args=["--trials", "8"],
        api_options=RayJobOptions(backoff_limit=2, ttl_seconds_after_finished=600),
        kueue_queue="team-a",
    )
    manifest = build_rayjob(spec)
    assert schema_errors("rayjob", manifest) == []
    body = manifest["spec"]
    assert body["entrypoint"] == "python /app/tune.py --trials 8"
    assert (body["backoffLimit"], body["ttlSecondsAfterFinished"]) == (2, 600)
    assert body["suspend"] is True  # Kueue admits it
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def _stop_hook(pod: dict) -> list[str] | None:
    (ray,) = pod["template"]["spec"]["containers"]
    hook = ray.get("lifecycle", {}).get("preStop")
    return hook["exec"]["command"] if hook else None


def test_the_worker_pods_have_their_trainers_checkpoint_before_ray_stops():
    """A pod's SIGTERM never reaches a trainer under Ray Train (PID 1 is ray start): each worker
    pod's preStop hook creates the stop file on its /tmp emptyDir, where the trainers look for
    it (TMPDIR), and waits for them within the pod's grace period. The head trains nothing."""
    manifest = build_rayjob(ray_spec(termination_grace_period_seconds=300))
    assert schema_errors("rayjob", manifest) == []
    head, group = _pods(manifest)
    pod = group["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 300
    assert _stop_hook(group) == ["python", "-m", "trainer.stop_file", "--wait-s", "295"]
    (ray,) = pod["containers"]
    assert {"name": "TMPDIR", "value": "/tmp"} in ray["env"]
    tmp = next(m["name"] for m in ray["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp)
    assert _stop_hook(head) is None

    default_grace = build_rayjob(ray_spec(termination_grace_period_seconds=None))
    assert _stop_hook(_pods(default_grace)[1])[-1] == "25"  # of Kubernetes' 30 s
    users_program = build_rayjob(ray_spec(command=["python", "/app/tune.py"]))
    assert _stop_hook(_pods(users_program)[1]) is None  # it watches no stop file


@pytest.mark.parametrize(
    ("settings", "field", "words"),
    [
        ({"runtime_name": "torch-distributed"}, "runtime_name", "Kubeflow Trainer v2"),
        ({"elastic_min_replicas": 1, "elastic_max_replicas": 3}, "elastic_min_replicas", "fixed"),
        ({"scheduler_name": "volcano"}, "scheduler_name", "Kueue"),
        ({"restart_policy": "OnFailure"}, "restart_policy", "backoff_limit"),
        ({"env": {"RAY_ADDRESS": "x:1"}}, "env", "KubeRay"),
        ({"name": "n" * 49}, "name", "head-svc"),
        ({"backoff_limit": -1}, "backoff_limit", "between 0"),
        ({"gpus_per_worker": 2, "nproc_per_node": 1}, "nproc_per_node", "one worker per GPU"),
    ],
)
def test_what_a_rayjob_cannot_say_is_refused_naming_the_setting(settings, field, words):
    with pytest.raises(SpecError) as err:
        ray_spec(**settings)
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_the_job_phase_comes_from_the_deployment_and_the_ray_jobs_status():
    def phase(**status):
        return RAYJOB.phase({"status": status})

    assert phase(jobDeploymentStatus="Running", jobStatus="RUNNING").phase is None
    assert phase(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED").phase == "Succeeded"
    failed = phase(jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed")
    assert failed.phase == "Failed" and "AppFailed" in failed.message
    stopped = phase(jobDeploymentStatus="Complete", jobStatus="STOPPED")
    assert stopped.phase == "Failed" and "STOPPED" in stopped.message
    deadline = phase(jobDeploymentStatus="Failed", reason="DeadlineExceeded", message="past 60s")
    assert deadline.phase == "Failed" and "DeadlineExceeded: past 60s" in deadline.message
    assert RAYJOB.program_exit_code(deadline) is None
    said = "Job entrypoint command failed with exit code 2, last available logs: ..."
    bad_input = phase(jobDeploymentStatus="Failed", jobStatus="FAILED", message=said)
    assert RAYJOB.program_exit_code(bad_input) == 2  # permanent: recorded, never retried


def test_a_permanent_code_is_seen_before_kuberay_retries_and_a_retry_is_counted():
    """What KubeRay v1.7.0 wrote on the real node for a driver exiting 2 under backoffLimit 1:
    the Ray job FAILED with its code while the deployment still ran (6 s), then ``Retrying``
    with ``failed`` 1 (0.1 s), then a new cluster. The launcher acts on the first."""
    said = "Job entrypoint command failed with exit code {}, last available logs (truncated):\nx"

    def job(backoff, code, deployment="Running", failed=0):
        status = {"jobDeploymentStatus": deployment, "jobStatus": "FAILED", "failed": failed}
        status["message"] = said.format(code)
        return {"spec": {"backoffLimit": backoff}, "status": status}

    assert RAYJOB.permanent_code_before_retry(job(1, 2)) == 2
    assert RAYJOB.permanent_code_before_retry(job(1, 2, "Retrying", failed=1)) == 2
    assert RAYJOB.permanent_code_before_retry(job(2, 3, failed=1)) == 3  # a second retry to come
    assert RAYJOB.permanent_code_before_retry(job(1, 143)) is None  # a stop: retried, resumes
    assert RAYJOB.permanent_code_before_retry(job(1, 200)) is None  # a lost worker: retried
    assert RAYJOB.permanent_code_before_retry(job(0, 2)) is None  # no retry: Failed ends it
    assert RAYJOB.permanent_code_before_retry(job(1, 2, failed=1)) is None  # retries used up
    assert RAYJOB.permanent_code_before_retry(job(1, 2, "Failed", failed=1)) is None
    running = job(1, 2) | {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}
    assert RAYJOB.permanent_code_before_retry(running) is None
    retrying = job(1, 143, "Retrying", failed=1)
    assert RAYJOB.retries(retrying) == (1, "Job entrypoint command failed with exit code 143")
    assert RAYJOB.retries({"status": {"jobDeploymentStatus": "Running"}}) == (0, "")


def test_the_ray_head_is_sized_by_its_options():
    """Your Ray program's driver runs on the head: its CPU and memory can be raised."""
    head, _ = _pods(build_rayjob(ray_spec(ray_head_cpu="2", ray_head_memory="8Gi")))
    (ray,) = head["template"]["spec"]["containers"]
    assert ray["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"memory": "8Gi"},
    }
    head, _ = _pods(build_rayjob(ray_spec()))
    (ray,) = head["template"]["spec"]["containers"]
    assert ray["resources"]["requests"] == {"cpu": "500m", "memory": "2Gi"}
    with pytest.raises(SpecError) as err:
        ray_spec(ray_head_memory="lots")
    assert err.value.field == "ray_head_memory" and "Kubernetes quantity" in str(err.value)
