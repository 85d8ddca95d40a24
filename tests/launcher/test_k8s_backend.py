"""The Kubernetes backend against a real control plane (tests/cluster): the real API server with
the official CRDs, RBAC and Pod Security admission, the real Kubeflow Trainer, JobSet, Job and
Training Operator controllers with their webhooks. The launcher runs as a ServiceAccount bound to
the Role ``components.launcher.rbac`` renders; the test plays only the kubelet (pod status, logs
through the API server's ``pods/log``, events) and, where a test needs it, the scheduler's events.

Every behaviour is checked for both APIs that run our trainer: a TrainJob and a PyTorchJob follow
the same path through the shared pre-flight, log following, diagnosis and wait loop. A TFJob (a
TensorFlow program: Chief, Workers, parameter servers) takes that path too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from components.launcher import (
    JobExists,
    JobFailed,
    JobTimeout,
    KubernetesOptions,
    PreflightError,
    job_api,
    run_job,
)
from tests.cluster.play import JobPods
from tests.launcher.k8s_helpers import (
    ALL_APIS,
    APIS,
    create_directly,
    install_namespaced_runtime,
    jobs,
    kubeconfig_of,
    replica,
    role_without,
    run,
    seen_running,
    spec,
    succeed,
)

REPO = Path(__file__).resolve().parents[2]


def wait_gone(ns, api: str, name: str = "job", timeout: float = 30.0) -> None:
    """The job is gone from the API server, and the garbage collector took its pods."""
    selector = JobPods(ns.kubelet, ns.name, api, name).selector
    deadline = time.monotonic() + timeout
    while any(j["metadata"]["name"] == name for j in jobs(ns, api)) or ns.kubelet.pods(
        ns.name, selector
    ):
        assert time.monotonic() < deadline, f"{api} {name} or its pods still exist"
        time.sleep(0.2)


def job_exists(ns, api: str, name: str = "job") -> bool:
    return any(j["metadata"]["name"] == name for j in jobs(ns, api))


# -- success, logs, restarts ---------------------------------------------------------------------


@pytest.mark.parametrize("api", ALL_APIS)
def test_success_streams_prefixed_logs_and_deletes_the_job(k8s, api):
    lines: list[str] = []
    result = run(k8s, spec(k8s, api, workers=3), lines, succeed(workers=3, lines=3))
    assert result.phase == "Succeeded" and result.backend == "kubernetes" and result.api == api
    assert result.name == "job" and result.namespace == k8s.name and result.restarts == 0
    assert not result.reattached and result.duration_s > 0
    for node in range(3):
        for step in range(3):
            line = f"[{replica(api, node)}] step {step} from node {node}"
            assert line in lines, "\n".join(lines)
    assert f"[{replica(api, 0)}] step 2 from node 0" in result.log_tail
    kind = job_api(api).kind
    assert any(f"submitting a {kind}: api={api} was asked for" in x for x in lines)
    assert any(f"created {kind} {k8s.name}/job" in x for x in lines)
    wait_gone(k8s, api)  # succeeded: deleted (cleanup=on-success), pods collected


@pytest.mark.parametrize("api", APIS)
def test_logs_are_live_while_the_job_runs(k8s, api):
    seen_while_running: list[bool] = []
    lines: list[str] = []

    def scenario(job: JobPods) -> None:
        (pod,) = job.pods(1)
        job.run(pod)
        job.log(pod, "first line")
        job.sleep(2.5)  # the launcher must print it now, not when the job ends
        seen_while_running.append(any("first line" in x for x in lines))
        job.exit(pod)

    run(k8s, spec(k8s, api, workers=1), lines, scenario)
    assert seen_while_running == [True]


def test_a_dropped_log_stream_is_reopened_without_repeating_lines(k8s):
    def scenario(job: JobPods) -> None:
        (pod,) = job.pods(1)
        job.run(pod)
        for i in range(3):
            job.log(pod, f"before {i}")
        job.sleep(1.0)
        job.kubelet.drop_log_streams(pod)  # the container runs on
        for i in range(3):
            job.log(pod, f"after {i}")
        job.sleep(2.5)
        job.exit(pod)

    lines: list[str] = []
    run(k8s, spec(k8s, "pytorchjob", workers=1), lines, scenario)
    printed = [x for x in lines if x.startswith("[worker-0]")]
    assert printed == [f"[worker-0] before {i}" for i in range(3)] + [
        f"[worker-0] after {i}" for i in range(3)
    ], "\n".join(lines)


@pytest.mark.parametrize("api", APIS)
def test_cleanup_never_keeps_the_job(k8s, api):
    assert run(k8s, spec(k8s, api), None, succeed(), cleanup="never").phase == "Succeeded"
    assert job_exists(k8s, api)


@pytest.mark.parametrize("api", APIS)
def test_container_restarts_are_counted(k8s, api):
    result = run(k8s, spec(k8s, api), None, succeed(restarts=1))
    assert result.restarts == 2  # one restart on each of the two pods


@pytest.mark.parametrize("api", APIS)
def test_a_preempted_pod_is_recreated_counted_and_its_logs_follow(k8s, api):
    """Preemption deletes a running pod: the controller creates it again (a TrainJob's Job under
    a new name, the Training Operator under the same one) and the launcher follows the new one."""

    lines: list[str] = []

    def scenario(job: JobPods) -> None:
        (pod,) = job.pods(1)
        job.run(pod)
        seen_running(job, pod, "attempt 1", lines)
        job.delete(pod)  # the kubelet sends SIGTERM: exit 143, then the pod is gone
        pod = job.replacement(pod)
        job.run(pod)
        job.log(pod, "attempt 2")
        job.sleep(0.5)
        job.exit(pod)

    result = run(k8s, spec(k8s, api, workers=1), lines, scenario)
    name = replica(api, 0)
    assert result.phase == "Succeeded" and result.restarts == 1
    assert lines.count(f"[{name}] attempt 1") == 1 and lines.count(f"[{name}] attempt 2") == 1


# -- API choice ------------------------------------------------------------------------------------


def test_auto_picks_trainjob_when_trainer_v2_is_served(k8s):
    lines: list[str] = []
    result = run(k8s, spec(k8s, "auto"), lines, succeed(lines=1), scenario_api="trainjob")
    assert result.api == "trainjob"
    assert jobs(k8s, "pytorchjob") == []
    assert any(
        "submitting a TrainJob: api=auto: the cluster serves trainer.kubeflow.org/v1alpha1" in x
        for x in lines
    )


def test_auto_falls_back_to_pytorchjob_without_trainer_v2_and_never_to_a_tfjob(operator_k8s):
    ns = operator_k8s  # serves PyTorchJob and TFJob, not TrainJob
    lines: list[str] = []
    result = run(ns, spec(ns, "auto"), lines, succeed(lines=1), scenario_api="pytorchjob")
    assert result.api == "pytorchjob" and "[worker-0] step 0 from node 0" in lines
    assert any(
        "submitting a PyTorchJob: api=auto: the cluster serves kubeflow.org/v1 pytorchjobs "
        "(not trainer.kubeflow.org/v1alpha1)" in x
        for x in lines
    )
    assert jobs(ns, "tfjob") == []


def test_auto_refuses_a_spec_the_served_api_cannot_express(k8s):
    with pytest.raises(ValueError, match="api=trainjob cannot express it: elastic training"):
        run(k8s, spec(k8s, "auto", elastic_min_replicas=1, elastic_max_replicas=2))
    assert jobs(k8s, "trainjob") == [] and jobs(k8s, "pytorchjob") == []


def test_neither_api_served_names_both_installs(bare_k8s):
    bare_k8s.cluster.plane.serve_only(("tfjob",))  # a TFJob is never auto's choice
    with pytest.raises(PreflightError) as err:
        run(bare_k8s, spec(bare_k8s, "auto"))
    message = str(err.value)
    assert "serves neither" in message
    assert "kubeflow/trainer.git" in message and "training-operator.git" in message


def test_trainjob_not_served_is_a_preflight_error_naming_pytorchjob(operator_k8s):
    with pytest.raises(PreflightError) as err:
        run(operator_k8s, spec(operator_k8s, "trainjob"))
    assert "TrainJob CRD" in str(err.value) and "not installed" in str(err.value)
    assert "use api=pytorchjob or api=auto" in str(err.value)


def test_pytorchjob_and_tfjob_not_served_are_preflight_errors(bare_k8s):
    bare_k8s.cluster.plane.serve_only(("trainer",))
    with pytest.raises(PreflightError) as err:
        run(bare_k8s, spec(bare_k8s, "pytorchjob"))
    assert "PyTorchJob CRD" in str(err.value) and "use api=trainjob or api=auto" in str(err.value)
    with pytest.raises(PreflightError) as err:
        run(bare_k8s, spec(bare_k8s, "tfjob"))
    message = str(err.value)
    assert "TFJob CRD (tfjobs.kubeflow.org/v1) is not installed" in message
    assert "training-operator.git" in message
    assert "use api=" not in message  # a TensorFlow program has no PyTorch alternative


def test_rayjob_not_served_is_a_preflight_error_naming_kuberay(bare_k8s):
    bare_k8s.cluster.plane.serve_only(("trainer",))
    with pytest.raises(PreflightError) as err:
        run(bare_k8s, spec(bare_k8s, "rayjob"))
    message = str(err.value)
    assert "RayJob CRD (rayjobs.ray.io/v1) is not installed" in message
    assert "kuberay-operator" in message and "use api=" not in message
    assert jobs(bare_k8s, "trainjob") == []


def test_mpijob_not_served_is_a_preflight_error_naming_the_mpi_operator(bare_k8s):
    """A cluster with the Training Operator's old v1 MPIJob, or none: the v2beta1 MPIJob is
    not served, and pre-flight says what to install before anything is created."""
    bare_k8s.cluster.plane.serve_only(("trainer", "pytorchjob"))
    with pytest.raises(PreflightError) as err:
        run(bare_k8s, spec(bare_k8s, "mpijob", image="registry.example.com/mpi:1"))
    message = str(err.value)
    assert "MPIJob CRD (mpijobs.kubeflow.org/v2beta1) is not installed" in message, message
    assert "mpi-operator" in message and "use api=" not in message
    assert jobs(bare_k8s, "trainjob") == [] and jobs(bare_k8s, "pytorchjob") == []


# -- failures --------------------------------------------------------------------------------------


def crash_until_the_controller_gives_up(job: JobPods, pod, code: int, reason: str, times: int):
    """``restartPolicy: OnFailure``: the kubelet restarts the container after each crash, until
    the controller fails the job and deletes the pod."""
    from kubernetes.client.rest import ApiException

    for attempt in range(1, times + 1):
        try:
            job.crash(pod, code, restarts=attempt, reason=reason)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        job.sleep(0.2)


def oom_until_failed(job: JobPods) -> None:
    """One node OOM-killed (137: retryable) until the Job controller gives up and fails it."""
    (pod,) = job.pods(1)
    job.run(pod)
    crash_until_the_controller_gives_up(job, pod, 137, "OOMKilled", 7)
    job.sleep(60)


def failing_node(api: str):
    """Node 1 logs 30 lines and fails for good: under ExitCode (PyTorchJob) a permanent exit
    code fails the job; under OnFailure (TrainJob's Jobs, TFJob) OOMKilled until the backoff
    limit is used up."""

    def scenario(job: JobPods) -> None:
        first, second = job.pods(2)
        job.run(first)
        job.run(second)
        job.log(first, "node 0 is fine")
        for i in range(30):
            job.log(second, f"node 1 line {i}")
        job.sleep(0.5)
        job.event(second, "BackOff", "Back-off restarting failed container")
        if api in ("pytorchjob", "xgboostjob"):  # ExitCode; Never (the XGBoostJob's default)
            job.exit(second, 1, reason="Error")
        else:
            limit = 6 if api == "trainjob" else 3  # the Job's and the TFJob's backoffLimit
            crash_until_the_controller_gives_up(job, second, 137, "OOMKilled", limit + 1)

    return scenario


FAILURE = {
    "trainjob": "OOMKilled (exit code 137)",
    "pytorchjob": "Error (exit code 1)",
    "tfjob": "OOMKilled (exit code 137)",
    "xgboostjob": "Error (exit code 1)",
}


@pytest.mark.parametrize("api", ALL_APIS)
def test_failure_names_the_failing_pod_reason_events_and_log_tail(k8s, api):
    with pytest.raises(JobFailed) as err:
        run(k8s, spec(k8s, api), None, failing_node(api))
    message = str(err.value)
    assert f"({replica(api, 1)}): {FAILURE[api]}" in message, message
    if "OOMKilled" in FAILURE[api]:
        assert "killed the trainer for memory" in message and "raise memory_request" in message
    assert "BackOff: Back-off restarting failed container" in message
    assert "node 1 line 29" in message and "node 1 line 9" not in message  # the last 20 lines
    result = err.value.result
    assert result.phase == "Failed" and FAILURE[api].split()[0] in result.reason
    # The default cleanup keeps a failed job (and its pods) for inspection, and says how to go.
    kind = job_api(api).kind.lower()
    assert job_exists(k8s, api)
    assert (
        "kept for inspection" in message and f"kubectl delete {kind} -n {k8s.name} job" in message
    )


def test_cleanup_always_deletes_a_failed_job(k8s):
    with pytest.raises(JobFailed):
        run(k8s, spec(k8s, "pytorchjob"), None, failing_node("pytorchjob"), cleanup="always")
    wait_gone(k8s, "pytorchjob")


def exits_with_a_permanent_code(job: JobPods) -> None:
    """Bad config: the program exits 2; the kubelet (OnFailure) restarts it, again and again."""
    first, second = job.pods(2)
    job.run(first)
    job.run(second)
    job.log(second, "[trainer] error: --lr -1.0 must be a positive number")
    job.sleep(0.3)
    job.crash(second, 2, restarts=1)
    job.sleep(60)


@pytest.mark.parametrize(("api", "policy"), [("trainjob", None), ("pytorchjob", "OnFailure")])
def test_a_permanent_exit_code_stops_a_job_that_would_restart_it(k8s, api, policy):
    kw = {"restart_policy": policy} if policy else {}
    start = time.monotonic()
    with pytest.raises(JobFailed) as err:
        run(k8s, spec(k8s, api, **kw), None, exits_with_a_permanent_code)
    assert time.monotonic() - start < 30  # not after the scenario's minute
    message = str(err.value)
    assert "exited with permanent code 2" in message and "not retried" in message
    assert "--lr -1.0 must be a positive number" in message
    # It would only restart on every GPU again: suspended (pods gone), kept with the reason.
    (job,) = jobs(k8s, api)
    assert job_api(api).suspended(job) and job_api(api).permanent_failure(job)


def test_a_pytorchjob_with_exitcode_is_failed_by_the_operator(k8s):
    def scenario(job: JobPods) -> None:
        (pod,) = job.pods(1)
        job.run(pod)
        job.exit(pod, 3, reason="Error")

    with pytest.raises(JobFailed, match="Error \\(exit code 3\\)") as err:
        run(k8s, spec(k8s, "pytorchjob", workers=1), None, scenario)
    assert "PyTorchJob" in str(err.value) and job_exists(k8s, "pytorchjob")  # kept; TTL removes it
    (job,) = jobs(k8s, "pytorchjob")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"


def test_a_pytorchjob_worker_killed_with_137_is_restarted_and_the_job_succeeds(k8s):
    """ExitCode: 128-255 is retryable (the operator recreates the pod), 1-127 is not."""

    lines: list[str] = []

    def scenario(job: JobPods) -> None:
        first, second = job.pods(2)
        job.run(first)
        job.run(second)
        seen_running(job, second, "training", lines)
        job.exit(second, 137, reason="OOMKilled")
        second = job.replacement(second)
        job.run(second)
        job.log(second, "resumed")
        job.exit(second)
        job.exit(first)

    result = run(k8s, spec(k8s, "pytorchjob"), lines, scenario)
    assert result.phase == "Succeeded" and result.restarts >= 1
    assert "[worker-1] resumed" in lines


@pytest.mark.parametrize("api", ALL_APIS)
def test_timeout_deletes_the_job_then_fails(k8s, api):
    with pytest.raises(JobTimeout) as err:
        run(k8s, spec(k8s, api), None, succeed(lines=100, delay=0.1), timeout_s=2)
    assert "timeout_s=2" in str(err.value) and "deleted" in str(err.value)
    assert err.value.result.phase == "Timeout"
    wait_gone(k8s, api)  # the job, its JobSet/Jobs and its pods (the real garbage collector)


# -- re-attach ---------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ALL_APIS)
def test_a_retried_step_reattaches_to_its_job(k8s, api):
    s = spec(k8s, api)
    first = create_directly(k8s, s)  # a first attempt of this step created it, then was retried
    lines: list[str] = []
    result = run(k8s, s, lines, succeed(lines=3), cleanup="never")
    assert result.reattached and result.phase == "Succeeded"
    (job,) = jobs(k8s, api)
    assert job["metadata"]["uid"] == first["metadata"]["uid"]  # no second job
    assert any("re-attaching" in x for x in lines)
    assert any(f"[{replica(api, 1)}] step 2 from node 1" in x for x in lines)


@pytest.mark.parametrize("api", APIS)
def test_another_runs_job_of_that_name_is_a_clear_error(k8s, api):
    create_directly(k8s, spec(k8s, api, run_id="someone-else"))
    kind = job_api(api).kind.lower()
    with pytest.raises(JobExists, match=rf"already exists.*kubectl delete {kind} -n {k8s.name}"):
        run(k8s, spec(k8s, api))
    assert job_exists(k8s, api)


# -- pre-flight ------------------------------------------------------------------------------------


def test_a_runtime_the_trainer_does_not_know_is_refused_before_anything_runs(k8s):
    """A namespaced Role cannot read a ClusterTrainingRuntime (noted), so the Trainer's webhook is
    what refuses the job (HTTP 403, like RBAC): its own words reach the user, not an RBAC hint."""
    lines: list[str] = []
    with pytest.raises(PreflightError) as err:
        run(k8s, spec(k8s, "trainjob", runtime_name="nope"), lines)
    assert any("may not read ClusterTrainingRuntime 'nope'" in x for x in lines)
    message = str(err.value)
    assert "the cluster refused TrainJob" in message and "nothing was submitted" in message
    assert 'ClusterTrainingRuntime.trainer.kubeflow.org "nope" not found' in message
    assert "rbac.yaml" not in message
    assert jobs(k8s, "trainjob") == []


def test_a_missing_namespaced_runtime_fails_preflight(k8s):
    with pytest.raises(PreflightError, match="TrainingRuntime 'mine' does not exist in namespace"):
        run(k8s, spec(k8s, "trainjob", runtime_kind="TrainingRuntime", runtime_name="mine"))
    assert jobs(k8s, "trainjob") == []


def test_a_namespaced_runtime_that_exists_is_used(k8s):
    install_namespaced_runtime(k8s, "mine")
    s = spec(k8s, "trainjob", runtime_kind="TrainingRuntime", runtime_name="mine")
    assert run(k8s, s, None, succeed(lines=1), cleanup="never").phase == "Succeeded"
    (job,) = jobs(k8s, "trainjob")
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "mine",
    }


def test_preflight_refuses_a_job_not_built_for_its_runtimes_mpi_policy(k8s):
    install_namespaced_runtime(k8s, "my-mpi", "runtimes/deepspeed_distributed.yaml")
    install_namespaced_runtime(k8s, "mine")
    program = {"command": ["python", "-m", "trainer.mpirun", "/app/train.py"], "image": "my/mpi:1"}
    namespaced = {"runtime_kind": "TrainingRuntime"}
    with pytest.raises(PreflightError, match="'my-mpi' has mlPolicy mpi .*set ml_policy=mpi"):
        run(k8s, spec(k8s, "trainjob", runtime_name="my-mpi", **namespaced, **program))
    mine = spec(k8s, "trainjob", runtime_name="mine", ml_policy="mpi", **namespaced, **program)
    with pytest.raises(PreflightError, match="'mine' has mlPolicy torch, but ml_policy=mpi"):
        run(k8s, mine)
    assert jobs(k8s, "trainjob") == []


@pytest.mark.parametrize("api", ALL_APIS)
def test_forbidden_fails_preflight_naming_the_missing_permissions(k8s, api):
    plural = job_api(api).plural
    documents = role_without(k8s.name, ("create", plural), ("get", "pods/log"))
    configuration = k8s.launcher_configuration(documents=documents)
    with pytest.raises(PreflightError) as err:
        run(k8s, spec(k8s, api), configuration=configuration)
    assert f"create {plural}" in str(err.value) and "get pods/log" in str(err.value)
    assert "rbac.yaml" in str(err.value)
    assert jobs(k8s, api) == []


def test_no_credentials_or_unreachable_api_is_a_preflight_error(tmp_path: Path):
    with pytest.raises(PreflightError, match="no Kubernetes credentials"):
        opts = KubernetesOptions(config_file=str(tmp_path / "missing-kubeconfig"))
        run_job(spec("default", "auto"), backend="kubernetes", options=opts)
    cfg = k8s_client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg.retries = 0
    opts = KubernetesOptions(client_configuration=cfg, handle_sigterm=False)
    with pytest.raises(
        PreflightError, match="cannot reach the Kubernetes API at http://127.0.0.1:9"
    ):
        run_job(spec("default", "auto"), backend="kubernetes", options=opts)


@pytest.mark.parametrize("api", APIS)
def test_a_namespace_that_does_not_exist_fails_preflight(k8s, api):
    # As the launcher's account: it may not read namespaces, and has no Role in that one.
    with pytest.raises(PreflightError) as err:
        run(k8s, spec(k8s, api, namespace="nowhere"))
    assert "'nowhere'" in str(err.value) and "does not exist" in str(err.value)
    # As an admin, who may read namespaces: the plain answer.
    admin = k8s.cluster.plane.admin_configuration()
    with pytest.raises(PreflightError, match="namespace 'nowhere' does not exist"):
        run(k8s, spec(k8s, api, namespace="nowhere"), configuration=admin)


# -- watchdog --------------------------------------------------------------------------------------


def unschedulable(job: JobPods, message: str) -> None:
    """What the scheduler posts about a pod it cannot place (no scheduler runs here)."""
    for pod in job.pods(1):
        job.kubelet.core.patch_namespaced_pod_status(
            pod.metadata.name,
            job.namespace,
            {
                "status": {
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                        }
                    ]
                }
            },
        )
        job.event(pod, "FailedScheduling", message)


@pytest.mark.parametrize("api", APIS)
def test_pending_watchdog_fails_with_the_scheduler_message(k8s, api):
    def scenario(job: JobPods) -> None:
        unschedulable(job, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
        job.sleep(60)

    with pytest.raises(JobFailed) as err:
        run(
            k8s, spec(k8s, api, workers=1), None, scenario, pending_timeout_s=2, watchdog_fails=True
        )
    message = str(err.value)
    assert "Pending after 2 s" in message and "Insufficient nvidia.com/gpu" in message
    wait_gone(k8s, api)


@pytest.mark.parametrize("api", APIS)
def test_an_image_that_cannot_be_pulled_is_reported_by_the_pending_watchdog(k8s, api):
    """A pod that never starts does not fail its job by itself: the watchdog says why."""

    def scenario(job: JobPods) -> None:
        (pod,) = job.pods(1)
        job.waiting(pod, "ImagePullBackOff", 'Back-off pulling image "nope:1"')
        job.event(pod, "Failed", 'Failed to pull image "nope:1": not found')
        job.sleep(60)

    with pytest.raises(JobFailed) as err:
        run(
            k8s, spec(k8s, api, workers=1), None, scenario, pending_timeout_s=2, watchdog_fails=True
        )
    assert 'ImagePullBackOff: Back-off pulling image "nope:1"' in str(err.value)
    assert 'Failed to pull image "nope:1"' in str(err.value)


def test_a_suspended_job_waiting_for_kueue_is_reported(k8s):
    with pytest.raises(JobFailed, match="suspended, waiting for Kueue to admit it"):
        run(
            k8s,
            spec(k8s, "trainjob", kueue_queue="team-a"),
            pending_timeout_s=2,
            watchdog_fails=True,
        )


def test_pending_watchdog_reports_and_keeps_waiting(k8s):
    def scenario(job: JobPods) -> None:
        unschedulable(job, "0/1 nodes are available: 1 Insufficient cpu.")
        job.sleep(3.5)
        (pod,) = job.pods(1)
        job.run(pod)
        job.log(pod, "finally")
        job.exit(pod)

    lines: list[str] = []
    result = run(k8s, spec(k8s, "trainjob", workers=1), lines, scenario, pending_timeout_s=2)
    assert result.phase == "Succeeded"
    assert len(result.watchdog) == 1 and "Insufficient cpu" in result.watchdog[0]
    assert any(x.startswith("[launcher] watchdog: pods still Pending") for x in lines)


@pytest.mark.parametrize("api", APIS)
def test_silence_watchdog_catches_a_hang(k8s, api):
    def scenario(job: JobPods) -> None:
        (pod,) = job.pods(1)
        job.run(pod)
        job.log(pod, "init process group ...")
        job.sleep(60)

    with pytest.raises(JobFailed, match="no replica logged anything for 2 s"):
        run(
            k8s, spec(k8s, api, workers=1), None, scenario, silence_timeout_s=2, watchdog_fails=True
        )
    wait_gone(k8s, api)


# -- SIGTERM (the pipeline run cancelled) ----------------------------------------------------------

SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys
    from components.launcher import JobCancelled, KubernetesOptions, TrainSpec, run_job

    api, namespace, kubeconfig = sys.argv[1:4]
    users = api in ("tfjob", "xgboostjob")
    program = {"image": "tf:1", "command": ["python", "train.py"]} if users else {}
    spec = TrainSpec.flat(
        api=api, name="job", namespace=namespace, workers=2, run_id="run-1", **program
    )
    options = KubernetesOptions(config_file=kubeconfig, poll_interval_s=1.0)
    try:
        run_job(spec, backend="kubernetes", options=options)
    except JobCancelled as exc:
        print("CANCELLED:", exc, flush=True)
        sys.exit(143)
    """
)


@pytest.mark.parametrize("api", ALL_APIS)
def test_sigterm_deletes_the_job_then_exits(k8s, tmp_path: Path, api):
    started = []

    def scenario(job: JobPods) -> None:
        pods = job.pods(2)
        for pod in pods:
            job.run(pod)
        for step in range(200):
            for i, pod in enumerate(pods):
                job.log(pod, f"step {step} from node {i}")
            started.append(step)
            job.sleep(0.1)

    script = tmp_path / "launch.py"
    script.write_text(SIGTERM_SCRIPT)
    kubeconfig = kubeconfig_of(k8s.launcher_configuration(), tmp_path / "kubeconfig")
    k8s.scenario(api, "job", scenario)
    proc = subprocess.Popen(
        [sys.executable, str(script), api, k8s.name, str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while len(started) < 10:
            assert time.monotonic() < deadline and proc.poll() is None, "the job never ran"
            time.sleep(0.1)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    kind = job_api(api).kind
    assert proc.returncode == 143, out
    assert "CANCELLED" in out and f"deleted {kind} {k8s.name}/job (cancelled (SIGTERM))" in out
    assert f"[{replica(api, 0)}] step 0 from node 0" in out
    wait_gone(k8s, api)


# -- TFJob specifics -----------------------------------------------------------------------------


def test_a_tfjob_with_parameter_servers_follows_chief_workers_and_ps(k8s):
    def scenario(job: JobPods) -> None:
        pods = job.pods(3)  # chief-0, worker-0, ps-0
        for pod in pods:
            job.run(pod)
        for pod in pods:
            job.log(pod, f"hello from {pod.metadata.name}")
        job.sleep(0.5)
        job.exit(pods[0])  # the Chief succeeded: the TFJob succeeds (default success policy)

    lines: list[str] = []
    result = run(k8s, spec(k8s, "tfjob", ps_replicas=1), lines, scenario, cleanup="never")
    assert result.phase == "Succeeded" and result.api == "tfjob"
    for name in ("chief-0", "worker-0", "ps-0"):
        assert f"[{name}] hello from job-{name}" in lines
    (manifest,) = jobs(k8s, "tfjob")
    assert {k: v["replicas"] for k, v in manifest["spec"]["tfReplicaSpecs"].items()} == {
        "Chief": 1,
        "Worker": 1,
        "PS": 1,
    }
    tf_config = {
        e.name: e.value
        for pod in k8s.kubelet.pods(k8s.name, "training.kubeflow.org/job-name=job")
        for e in pod.spec.containers[0].env or []
    }
    assert "TF_CONFIG" in tf_config  # the operator's, not ours
