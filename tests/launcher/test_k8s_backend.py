"""Kubernetes backend through the real kubernetes client, against a stand-in API server on
loopback that plays Kubeflow Trainer v2 or the Training Operator v1 (no cluster can run here).

Every behaviour is checked for both APIs that run our trainer: a TrainJob and a PyTorchJob follow
the same path through the shared pre-flight, log following, diagnosis and wait loop. A TFJob (a
TensorFlow program: Chief, Workers, parameter servers) takes that path too: success, failure,
timeout, re-attach, SIGTERM and permissions are checked for it as well.
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
from kubernetes import client as k8s

from components.launcher import (
    JobExists,
    JobFailed,
    JobTimeout,
    KubernetesOptions,
    PreflightError,
    TrainSpec,
    job_api,
    run_job,
)
from tests.launcher.conftest import succeed
from tests.launcher.fake_controller import Operator

APIS = ("trainjob", "pytorchjob")
ALL_APIS = (*APIS, "tfjob")
REPO = Path(__file__).resolve().parents[2]
TF_PROGRAM = {"image": "registry.example.com/tf-mnist:1", "command": ["python", "/app/train.py"]}
"""A TFJob runs the user's TensorFlow image and command."""


def replica(api: str, node: int) -> str:
    """How the launcher names node ``node``'s log lines."""
    if api == "trainjob":
        return f"node-{node}"
    first = "chief-0" if api == "tfjob" else "master-0"
    return first if node == 0 else f"worker-{node - 1}"


def spec(api: str, **kw) -> TrainSpec:
    base = {"api": api, "name": "job", "namespace": "default", "workers": 2, "run_id": "run-1"}
    return TrainSpec(**(base | (TF_PROGRAM if api == "tfjob" else {}) | kw))


def run(fake, s: TrainSpec, lines: list[str] | None = None, **options):
    out = lines if lines is not None else []
    opts = KubernetesOptions(
        client_configuration=fake.configuration(),
        log=out.append,
        poll_interval_s=1.0,
        handle_sigterm=False,
        **options,
    )
    return run_job(s, backend="kubernetes", options=opts)


def create_directly(fake, s: TrainSpec) -> None:
    """Create ``s``'s job as a first attempt of the step would have."""
    api = job_api(s.api)
    k8s.CustomObjectsApi(k8s.ApiClient(fake.configuration())).create_namespaced_custom_object(
        api.group, api.version, s.namespace, api.plural, api.build(s)
    )


@pytest.mark.parametrize("api", ALL_APIS)
def test_success_streams_prefixed_logs_and_deletes_the_job(fake_api, api):
    fake = fake_api(scenario=succeed(workers=3, lines=3))
    lines: list[str] = []
    result = run(fake, spec(api, workers=3), lines)
    assert result.phase == "Succeeded" and result.backend == "kubernetes" and result.api == api
    assert result.name == "job" and result.namespace == "default" and result.restarts == 0
    assert not result.reattached and result.duration_s > 0
    for node in range(3):
        for step in range(3):
            assert f"[{replica(api, node)}] step {step} from node {node}" in lines
    assert f"[{replica(api, 0)}] step 2 from node 0" in result.log_tail
    assert fake.created == ["job"] and fake.deleted == ["job"]  # succeeded: deleted
    kind = job_api(api).kind
    assert any(f"submitting a {kind}: api={api} was asked for" in x for x in lines)


@pytest.mark.parametrize("api", APIS)
def test_logs_are_live_while_the_job_runs(fake_api, api):
    seen_while_running: list[bool] = []
    lines: list[str] = []

    def scenario(op: Operator) -> None:
        op.condition("Created")
        pod = op.add_node(0)
        op.running(pod)
        op.log(pod, "first line")
        op.sleep(1.5)  # the launcher must print it now, not when the job ends
        seen_while_running.append(any("first line" in x for x in lines))
        op.terminate(pod)
        op.succeed()

    run(fake_api(scenario=scenario), spec(api, workers=1), lines)
    assert seen_while_running == [True]


def test_auto_picks_trainjob_when_trainer_v2_is_served(fake_api):
    fake = fake_api(scenario=succeed(lines=1), served=("trainjob", "pytorchjob"))
    lines: list[str] = []
    result = run(fake, spec("auto"), lines)
    assert result.api == "trainjob"
    assert fake.objects["trainjobs"] == {} and fake.calls >= {
        ("trainer.kubeflow.org", "trainjobs", "create")
    }
    assert ("kubeflow.org", "pytorchjobs", "create") not in fake.calls
    assert any(
        "submitting a TrainJob: api=auto: the cluster serves trainer.kubeflow.org/v1alpha1" in x
        for x in lines
    )


def test_auto_falls_back_to_pytorchjob_without_trainer_v2(fake_api):
    fake = fake_api(scenario=succeed(lines=1), served=("pytorchjob",))
    lines: list[str] = []
    result = run(fake, spec("auto"), lines)
    assert result.api == "pytorchjob" and "[master-0] step 0 from node 0" in lines
    assert any(
        "submitting a PyTorchJob: api=auto: the cluster serves kubeflow.org/v1 pytorchjobs "
        "(not trainer.kubeflow.org/v1alpha1)" in x
        for x in lines
    )


def test_auto_refuses_a_spec_the_served_api_cannot_express(fake_api):
    fake = fake_api(served=("trainjob",))
    with pytest.raises(ValueError, match="api=trainjob cannot express it: elastic training"):
        run(fake, spec("auto", elastic_min_replicas=1, elastic_max_replicas=2))
    assert fake.created == []


def test_neither_api_served_names_both_installs(fake_api):
    fake = fake_api(served=("tfjob",))  # a TFJob is never auto's choice: it runs TensorFlow
    with pytest.raises(PreflightError) as err:
        run(fake, spec("auto"))
    message = str(err.value)
    assert "serves neither" in message
    assert "kubeflow/trainer.git" in message and "training-operator.git" in message
    assert fake.created == []


@pytest.mark.parametrize(("api", "other"), [("trainjob", "pytorchjob"), ("pytorchjob", "trainjob")])
def test_an_api_not_served_is_a_preflight_error_naming_the_one_that_is(fake_api, api, other):
    fake = fake_api(served=(other,))
    with pytest.raises(PreflightError) as err:
        run(fake, spec(api))
    assert "CRD" in str(err.value) and "not installed" in str(err.value)
    assert f"use api={other} or api=auto" in str(err.value)
    assert fake.created == []


@pytest.mark.parametrize("api", APIS)
def test_cleanup_never_keeps_the_job(fake_api, api):
    fake = fake_api(scenario=succeed())
    assert run(fake, spec(api), cleanup="never").phase == "Succeeded"
    assert fake.deleted == [] and fake.job("job") is not None


@pytest.mark.parametrize("api", APIS)
def test_restarts_are_counted(fake_api, api):
    fake = fake_api(scenario=succeed(restarts=1))
    assert run(fake, spec(api)).restarts == 2  # one restart on each of the two pods


@pytest.mark.parametrize("api", APIS)
def test_recreated_pods_count_as_restarts_and_their_logs_follow(fake_api, api):
    def scenario(op: Operator) -> None:
        pod = op.add_node(0)
        op.running(pod)
        op.log(pod, "attempt 1")
        op.sleep(0.3)
        op.terminate(pod, exit_code=143, reason="Error")  # preempted: retryable
        op.delete_pod(pod)
        pod = op.add_node(0)
        op.running(pod)
        op.log(pod, "attempt 2")
        op.sleep(0.3)
        op.terminate(pod)
        op.succeed()

    lines: list[str] = []
    kw = {"restart_policy": "ExitCode"} if api == "pytorchjob" else {}
    result = run(fake_api(scenario=scenario), spec(api, workers=1, **kw), lines)
    # A TrainJob's JobSet pod comes back under a new name, a PyTorchJob's under the same one:
    # either way it is the same node, restarted once.
    name = replica(api, 0)
    assert result.phase == "Succeeded" and result.restarts == 1
    assert lines.count(f"[{name}] attempt 1") == 1 and lines.count(f"[{name}] attempt 2") == 1


def failing_node(reason: str, exit_code: int):
    def scenario(op: Operator) -> None:
        op.condition("Created")
        first, second = op.add_node(0), op.add_node(1)
        op.running(first)
        op.running(second)
        op.condition("Running")
        op.log(first, "node 0 is fine")
        for i in range(30):
            op.log(second, f"node 1 line {i}")
        op.sleep(0.3)
        op.terminate(second, exit_code=exit_code, reason=reason)
        op.event(second, "BackOff", "Back-off restarting failed container")
        op.sleep(0.2)
        op.fail(f"{op.kind.kind} job failed because 1 replica(s) failed.")

    return scenario


@pytest.mark.parametrize("api", ALL_APIS)
def test_failure_names_the_failing_pod_reason_events_and_log_tail(fake_api, api):
    fake = fake_api(scenario=failing_node("OOMKilled", 137))
    with pytest.raises(JobFailed) as err:
        run(fake, spec(api))
    message = str(err.value)
    assert f"({replica(api, 1)}): OOMKilled (exit code 137)" in message
    assert "1 replica(s) failed" in message
    assert "BackOff: Back-off restarting failed container" in message
    assert "node 1 line 29" in message and "node 1 line 9" not in message  # the last 20 lines
    result = err.value.result
    assert result.phase == "Failed" and "OOMKilled" in result.reason
    # The default cleanup keeps a failed job (and its pods) for inspection, and says how to go.
    kind = job_api(api).kind.lower()
    assert fake.deleted == [] and fake.job("job") is not None
    assert "kept for inspection" in message and f"kubectl delete {kind} -n default job" in message


@pytest.mark.parametrize("api", APIS)
def test_cleanup_always_deletes_a_failed_job(fake_api, api):
    fake = fake_api(scenario=failing_node("OOMKilled", 137))
    with pytest.raises(JobFailed):
        run(fake, spec(api), cleanup="always")
    assert fake.deleted == ["job"]


def restarting_on_permanent_exit(op: Operator) -> None:
    """A controller that restarts a container whatever its exit code (a TrainJob's Jobs, a
    PyTorchJob with OnFailure): bad config exits 2, again and again."""
    op.condition("Created")
    first, second = op.add_node(0), op.add_node(1)
    op.running(first)
    op.running(second)
    op.log(second, "[trainer] error: --lr -1.0 must be a positive number")
    op.sleep(0.2)
    op.terminate(second, exit_code=2, reason="Error")
    op.sleep(0.2)
    op.running(second, restarts=1, last_exit=2)
    op.sleep(60)  # never fails by itself


@pytest.mark.parametrize(("api", "policy"), [("trainjob", None), ("pytorchjob", "OnFailure")])
def test_a_permanent_exit_code_stops_a_job_that_would_restart_it(fake_api, api, policy):
    fake = fake_api(scenario=restarting_on_permanent_exit)
    kw = {"restart_policy": policy} if policy else {}
    start = time.monotonic()
    with pytest.raises(JobFailed) as err:
        run(fake, spec(api, **kw))
    assert time.monotonic() - start < 20  # not after the scenario's minute
    message = str(err.value)
    assert "exited with permanent code 2" in message and "not retried" in message
    assert "--lr -1.0 must be a positive number" in message
    assert fake.deleted == ["job"]  # it would only restart on every GPU again


def test_a_pytorchjob_with_exitcode_is_left_to_the_operator(fake_api):
    def scenario(op: Operator) -> None:
        pod = op.add_node(0)
        op.running(pod)
        op.terminate(pod, exit_code=3, reason="Error")
        op.sleep(1.5)  # the operator marks the job Failed (ExitCode: 3 is permanent)
        op.fail("PyTorchJob job is failed because 1 Master replica(s) failed.")

    fake = fake_api(scenario=scenario)
    with pytest.raises(JobFailed, match="Master replica"):
        run(fake, spec("pytorchjob", workers=1))
    assert fake.deleted == []  # kept for inspection (its TTL removes it)
    assert fake.created_manifests[0]["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == (
        "ExitCode"
    )


@pytest.mark.parametrize("api", APIS)
def test_failure_before_start_reports_image_pull_errors(fake_api, api):
    def scenario(op: Operator) -> None:
        pod = op.add_node(0)
        op.waiting(pod, "ImagePullBackOff", 'Back-off pulling image "nope:1"')
        op.event(pod, "Failed", 'Failed to pull image "nope:1": not found')
        op.sleep(0.3)
        op.fail("image pull failed")

    fake = fake_api(scenario=scenario)
    with pytest.raises(JobFailed) as err:
        run(fake, spec(api, workers=1), cleanup="on-success")
    assert 'ImagePullBackOff: Back-off pulling image "nope:1"' in str(err.value)
    assert 'Failed to pull image "nope:1"' in str(err.value)
    assert fake.deleted == []  # on-success keeps a failed job for debugging


@pytest.mark.parametrize("api", ALL_APIS)
def test_timeout_deletes_the_job_then_fails(fake_api, api):
    fake = fake_api(scenario=succeed(lines=100, delay=0.1))
    with pytest.raises(JobTimeout) as err:
        run(fake, spec(api), timeout_s=1.5)
    assert "timeout_s=1.5" in str(err.value) and "deleted" in str(err.value)
    assert err.value.result.phase == "Timeout"
    assert fake.deleted == ["job"] and fake.job("job") is None


@pytest.mark.parametrize("api", ALL_APIS)
def test_conflict_from_the_same_run_reattaches(fake_api, api):
    fake = fake_api(scenario=succeed(lines=3))
    s = spec(api)
    create_directly(fake, s)  # a first attempt of this step created it, then it was retried
    lines: list[str] = []
    result = run(fake, s, lines)
    assert result.reattached and result.phase == "Succeeded"
    assert fake.created == ["job"]  # no duplicate
    assert any("re-attaching" in x for x in lines)
    assert any(f"[{replica(api, 1)}] step 2 from node 1" in x for x in lines)


@pytest.mark.parametrize("api", APIS)
def test_conflict_with_another_runs_job_is_a_clear_error(fake_api, api):
    fake = fake_api()
    create_directly(fake, spec(api, run_id="someone-else"))
    kind = job_api(api).kind.lower()
    with pytest.raises(JobExists, match=rf"already exists.*kubectl delete {kind} -n default"):
        run(fake, spec(api))
    assert fake.deleted == []


def test_a_missing_runtime_fails_preflight_before_creating(fake_api):
    fake = fake_api(runtimes=())
    with pytest.raises(PreflightError, match="ClusterTrainingRuntime 'torch-distributed' does not"):
        run(fake, spec("trainjob"))
    assert fake.created == []
    fake = fake_api(runtimes=("torch-distributed",))
    with pytest.raises(PreflightError, match="TrainingRuntime 'mine' does not exist in namespace"):
        run(fake, spec("trainjob", runtime_kind="TrainingRuntime", runtime_name="mine"))


def test_a_runtime_that_exists_is_used_and_an_unreadable_one_is_only_noted(fake_api):
    fake = fake_api(scenario=succeed(lines=1), namespaced_runtimes=(("default", "mine"),))
    s = spec("trainjob", runtime_kind="TrainingRuntime", runtime_name="mine")
    assert run(fake, s).phase == "Succeeded"
    assert fake.created_manifests[0]["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "mine",
    }
    fake = fake_api(scenario=succeed(lines=1), runtime_forbidden=True)
    lines: list[str] = []
    assert run(fake, spec("trainjob"), lines).phase == "Succeeded"
    assert any("may not read ClusterTrainingRuntime 'torch-distributed'" in x for x in lines)


@pytest.mark.parametrize("api", ALL_APIS)
def test_forbidden_fails_preflight_naming_the_missing_permissions(fake_api, api):
    plural = job_api(api).plural
    fake = fake_api(denied={("create", plural), ("get", "pods/log")})
    with pytest.raises(PreflightError) as err:
        run(fake, spec(api))
    assert f"create {plural}" in str(err.value) and "get pods/log" in str(err.value)
    assert "rbac.yaml" in str(err.value)
    assert fake.created == []


def test_no_credentials_or_unreachable_api_is_a_preflight_error(tmp_path: Path):
    with pytest.raises(PreflightError, match="no Kubernetes credentials"):
        options = KubernetesOptions(config_file=str(tmp_path / "missing-kubeconfig"))
        run_job(spec("auto"), backend="kubernetes", options=options)
    cfg = k8s.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg.retries = 0
    options = KubernetesOptions(client_configuration=cfg, handle_sigterm=False)
    with pytest.raises(
        PreflightError, match="cannot reach the Kubernetes API at http://127.0.0.1:9"
    ):
        run_job(spec("auto"), backend="kubernetes", options=options)


@pytest.mark.parametrize("api", APIS)
def test_missing_namespace_fails_preflight(fake_api, api):
    fake = fake_api()
    with pytest.raises(PreflightError, match="namespace 'nowhere' does not exist"):
        run(fake, spec(api, namespace="nowhere"))


def test_namespace_unreadable_falls_back_to_the_create_answer(fake_api):
    fake = fake_api(namespace_forbidden=True, scenario=succeed(lines=1))
    assert run(fake, spec("trainjob")).phase == "Succeeded"
    fake2 = fake_api(namespace_forbidden=True)
    with pytest.raises(PreflightError, match="'nowhere' does not exist"):
        run(fake2, spec("pytorchjob", namespace="nowhere"))


def stuck_pending(op: Operator) -> None:
    op.condition("Created")
    pod = op.add_node(0)
    op.unschedulable(pod, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
    op.sleep(60)


@pytest.mark.parametrize("api", APIS)
def test_pending_watchdog_fails_with_the_scheduler_message(fake_api, api):
    fake = fake_api(scenario=stuck_pending)
    with pytest.raises(JobFailed) as err:
        run(fake, spec(api, workers=1), pending_timeout_s=1.0, watchdog_fails=True)
    message = str(err.value)
    assert "Pending after 1 s" in message and "Insufficient nvidia.com/gpu" in message
    assert fake.deleted == ["job"]


def test_a_suspended_job_waiting_for_kueue_is_reported(fake_api):
    def scenario(op: Operator) -> None:
        op.condition("Suspended", "Suspended", "TrainJob is suspended")
        op.sleep(60)

    fake = fake_api(scenario=scenario)
    with pytest.raises(JobFailed, match="suspended, waiting for Kueue to admit it"):
        run(
            fake, spec("trainjob", kueue_queue="team-a"), pending_timeout_s=1.0, watchdog_fails=True
        )
    assert fake.created_manifests[0]["spec"]["suspend"] is True


def test_pending_watchdog_reports_and_keeps_waiting(fake_api):
    def scenario(op: Operator) -> None:
        pod = op.add_node(0)
        op.unschedulable(pod, "0/1 nodes are available: 1 Insufficient cpu.")
        op.sleep(2.5)
        op.running(pod)
        op.log(pod, "finally")
        op.terminate(pod)
        op.succeed()

    lines: list[str] = []
    result = run(
        fake_api(scenario=scenario), spec("trainjob", workers=1), lines, pending_timeout_s=1.0
    )
    assert result.phase == "Succeeded"
    assert len(result.watchdog) == 1 and "Insufficient cpu" in result.watchdog[0]
    assert any(x.startswith("[launcher] watchdog: pods still Pending") for x in lines)


@pytest.mark.parametrize("api", APIS)
def test_silence_watchdog_catches_a_hang(fake_api, api):
    def scenario(op: Operator) -> None:
        pod = op.add_node(0)
        op.running(pod)
        op.log(pod, "init process group ...")
        op.sleep(60)

    fake = fake_api(scenario=scenario)
    with pytest.raises(JobFailed, match="no replica logged anything for 1 s"):
        run(fake, spec(api, workers=1), silence_timeout_s=1.0, watchdog_fails=True)
    assert fake.deleted == ["job"]


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys
    from kubernetes import client
    from components.launcher import JobCancelled, KubernetesOptions, TrainSpec, run_job

    cfg = client.Configuration()
    cfg.host = sys.argv[1]
    program = {"image": "tf:1", "command": ["python", "train.py"]} if sys.argv[2] == "tfjob" else {}
    spec = TrainSpec(
        api=sys.argv[2], name="job", namespace="default", workers=2, run_id="run-1", **program
    )
    options = KubernetesOptions(client_configuration=cfg, poll_interval_s=1.0)
    try:
        run_job(spec, backend="kubernetes", options=options)
    except JobCancelled as exc:
        print("CANCELLED:", exc, flush=True)
        sys.exit(143)
    """
)


@pytest.mark.parametrize("api", ALL_APIS)
def test_sigterm_deletes_the_job_then_exits(fake_api, tmp_path: Path, api):
    fake = fake_api(scenario=succeed(lines=200, delay=0.1))
    script = tmp_path / "launch.py"
    script.write_text(SIGTERM_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), fake.url, api],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        fake.wait_for(lambda: fake.job("job") is not None and any(fake.logs.values()))
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    kind = job_api(api).kind
    assert proc.returncode == 143, out
    assert "CANCELLED" in out and f"deleted {kind} default/job (cancelled (SIGTERM))" in out
    assert f"[{replica(api, 0)}] step 0 from node 0" in out
    assert fake.deleted == ["job"] and fake.job("job") is None


# -- TFJob specifics ----------------------------------------------------------------------------


def test_a_tfjob_with_parameter_servers_follows_chief_workers_and_ps(fake_api):
    def scenario(op: Operator) -> None:
        op.condition("Created")
        pods = [op.add_node(0), op.add_node(1), op.add_ps(0)]
        for pod in pods:
            op.running(pod)
        op.condition("Running")
        for pod in pods:
            op.log(pod, f"hello from {pod}")
        op.sleep(0.3)
        op.terminate(pods[0])  # the Chief succeeded: the TFJob succeeds (default success policy)
        op.succeed()

    fake = fake_api(scenario=scenario)
    lines: list[str] = []
    result = run(fake, spec("tfjob", ps_replicas=1), lines)
    assert result.phase == "Succeeded" and result.api == "tfjob"
    for name in ("chief-0", "worker-0", "ps-0"):
        assert f"[{name}] hello from job-{name}" in lines
    (manifest,) = fake.created_manifests
    assert manifest["kind"] == "TFJob"
    assert {k: v["replicas"] for k, v in manifest["spec"]["tfReplicaSpecs"].items()} == {
        "Chief": 1,
        "Worker": 1,
        "PS": 1,
    }
    assert fake.calls >= {("kubeflow.org", "tfjobs", "create")}
    assert ("kubeflow.org", "pytorchjobs", "create") not in fake.calls


def test_a_tfjob_not_served_names_the_training_operator_and_no_other_api(fake_api):
    fake = fake_api(served=("trainjob", "pytorchjob"))
    with pytest.raises(PreflightError) as err:
        run(fake, spec("tfjob"))
    message = str(err.value)
    assert "TFJob CRD (tfjobs.kubeflow.org/v1) is not installed" in message
    assert "training-operator.git" in message
    assert "use api=" not in message  # a TensorFlow program has no PyTorch alternative
    assert fake.created == []


def test_auto_never_submits_a_tfjob(fake_api):
    fake = fake_api(scenario=succeed(lines=1), served=("pytorchjob", "tfjob"))
    assert run(fake, spec("auto")).api == "pytorchjob"
    assert ("kubeflow.org", "tfjobs", "create") not in fake.calls
