"""Kubernetes backend through the real kubernetes client + TrainingClient, against a stand-in API
server on loopback that plays the Training Operator (no cluster can run here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from components.pytorchjob import (
    JobExists,
    JobFailed,
    JobTimeout,
    PreflightError,
    TrainSpec,
    build_pytorchjob,
    run_job,
)
from components.pytorchjob.backends.kubernetes import CLUSTER_PERMISSIONS, REQUIRED_PERMISSIONS
from components.pytorchjob.kfp_step import cleanup_step
from components.pytorchjob.rbac import RBAC_FILE, rbac_documents
from tests.pytorchjob.conftest import succeed
from tests.pytorchjob.fake_apiserver import Operator

FAST = {"poll_interval_s": 1.0, "handle_sigterm": False}


def spec(**kw) -> TrainSpec:
    return TrainSpec(
        **({"name": "job", "namespace": "default", "workers": 2, "run_id": "run-1"} | kw)
    )


def run(api, s: TrainSpec | None = None, lines: list[str] | None = None, **options):
    out = lines if lines is not None else []
    return run_job(
        s or spec(),
        backend="kubernetes",
        client_configuration=api.configuration(),
        log=out.append,
        **(FAST | options),
    )


def test_success_streams_prefixed_logs_and_deletes_the_job(fake_api):
    api = fake_api(scenario=succeed(workers=3, lines=3))
    lines: list[str] = []
    result = run(api, spec(workers=3), lines)
    assert result.phase == "Succeeded" and result.backend == "kubernetes"
    assert result.name == "job" and result.namespace == "default" and result.restarts == 0
    assert not result.reattached and result.duration_s > 0
    for replica, pod in (
        ("master-0", "job-master-0"),
        ("worker-0", "job-worker-0"),
        ("worker-1", "job-worker-1"),
    ):
        for step in range(3):
            assert f"[{replica}] step {step} from {pod}" in lines
    assert "[master-0] step 2 from job-master-0" in result.log_tail
    assert api.created == ["job"] and api.deleted == ["job"]  # cleanup="always"


def test_logs_are_live_while_the_job_runs(fake_api):
    seen_while_running: list[bool] = []

    def scenario(op: Operator) -> None:
        op.condition("Created")
        pod = op.add_pod("Master", 0)
        op.running(pod)
        op.log(pod, "first line")
        op.sleep(1.5)  # the launcher must print it now, not when the job ends
        seen_while_running.append(any("first line" in x for x in lines))
        op.terminate(pod)
        op.condition("Succeeded")

    lines: list[str] = []
    api = fake_api(scenario=scenario)
    run(api, spec(workers=1), lines)
    assert seen_while_running == [True]


def test_cleanup_never_keeps_the_job(fake_api):
    api = fake_api(scenario=succeed())
    assert run(api, cleanup="never").phase == "Succeeded"
    assert api.deleted == [] and api.job("job") is not None


def test_restarts_are_counted(fake_api):
    api = fake_api(scenario=succeed(restarts=1))
    assert run(api).restarts == 2  # one restart on each of the two pods


def test_recreated_pods_count_as_restarts_and_their_logs_follow(fake_api):
    def scenario(op: Operator) -> None:
        pod = op.add_pod("Master", 0)
        op.running(pod)
        op.log(pod, "attempt 1")
        op.sleep(0.3)
        op.terminate(pod, exit_code=143, reason="Error")  # preempted: retryable under ExitCode
        op.condition("Restarting")
        op.delete_pod(pod)
        pod = op.add_pod("Master", 0)
        op.running(pod)
        op.log(pod, "attempt 2")
        op.sleep(0.3)
        op.terminate(pod)
        op.condition("Succeeded")

    api = fake_api(scenario=scenario)
    lines: list[str] = []
    result = run(api, spec(workers=1, restart_policy="ExitCode"), lines)
    assert result.phase == "Succeeded" and result.restarts == 1
    assert lines.count("[master-0] attempt 1") == 1 and lines.count("[master-0] attempt 2") == 1


def failing_worker(reason: str, exit_code: int):
    def scenario(op: Operator) -> None:
        op.condition("Created")
        master, worker = op.add_pod("Master", 0), op.add_pod("Worker", 0)
        op.running(master)
        op.running(worker)
        op.condition("Running")
        op.log(master, "master is fine")
        for i in range(30):
            op.log(worker, f"worker line {i}")
        op.sleep(0.3)
        op.terminate(worker, exit_code=exit_code, reason=reason)
        op.event(worker, "BackOff", "Back-off restarting failed container")
        op.sleep(0.2)
        op.condition(
            "Failed",
            "PyTorchJobFailed",
            "PyTorchJob job is failed because 1 Worker replica(s) failed.",
        )

    return scenario


def test_failure_names_the_failing_pod_reason_events_and_log_tail(fake_api):
    api = fake_api(scenario=failing_worker("OOMKilled", 137))
    with pytest.raises(JobFailed) as err:
        run(api)
    message = str(err.value)
    assert "job-worker-0 (worker-0): OOMKilled (exit code 137)" in message
    assert "1 Worker replica(s) failed" in message
    assert "BackOff: Back-off restarting failed container" in message
    assert "worker line 29" in message and "worker line 9" not in message  # the last 20 lines
    result = err.value.result
    assert result.phase == "Failed" and "OOMKilled" in result.reason
    assert api.deleted == ["job"]


def test_failure_before_start_reports_image_pull_errors(fake_api):
    def scenario(op: Operator) -> None:
        pod = op.add_pod("Master", 0)
        op.waiting(pod, "ImagePullBackOff", 'Back-off pulling image "nope:1"')
        op.event(pod, "Failed", 'Failed to pull image "nope:1": not found')
        op.sleep(0.3)
        op.condition("Failed", "PyTorchJobFailed", "image pull failed")

    api = fake_api(scenario=scenario)
    with pytest.raises(JobFailed) as err:
        run(api, spec(workers=1), cleanup="on-success")
    assert 'ImagePullBackOff: Back-off pulling image "nope:1"' in str(err.value)
    assert 'Failed to pull image "nope:1"' in str(err.value)
    assert api.deleted == []  # on-success keeps a failed job for debugging


def test_timeout_deletes_the_job_then_fails(fake_api):
    api = fake_api(scenario=succeed(lines=100, delay=0.1))
    with pytest.raises(JobTimeout) as err:
        run(api, timeout_s=1.5)
    assert "timeout_s=1.5" in str(err.value) and "deleted" in str(err.value)
    assert err.value.result.phase == "Timeout"
    assert api.deleted == ["job"] and api.job("job") is None


def test_conflict_from_the_same_run_reattaches(fake_api):
    api = fake_api(scenario=succeed(lines=3))
    s = spec()
    k8s.CustomObjectsApi(k8s.ApiClient(api.configuration())).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", build_pytorchjob(s)
    )  # a first attempt of this step created it, then the step was retried
    lines: list[str] = []
    result = run(api, s, lines)
    assert result.reattached and result.phase == "Succeeded"
    assert api.created == ["job"]  # no duplicate
    assert any("re-attaching" in x for x in lines)
    assert any("step 2 from job-worker-0" in x for x in lines)


def test_conflict_with_another_runs_job_is_a_clear_error(fake_api):
    api = fake_api()
    other = build_pytorchjob(spec(run_id="someone-else"))
    k8s.CustomObjectsApi(k8s.ApiClient(api.configuration())).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", other
    )
    with pytest.raises(JobExists, match=r"already exists.*kubectl delete pytorchjob -n default"):
        run(api)
    assert api.deleted == []


def test_no_crd_fails_preflight_before_creating(fake_api):
    api = fake_api(crd_installed=False)
    with pytest.raises(PreflightError, match="CRD .*not installed.*Training Operator"):
        run(api)
    assert api.created == []


def test_forbidden_fails_preflight_naming_the_missing_permissions(fake_api):
    api = fake_api(denied={("create", "pytorchjobs"), ("get", "pods/log")})
    with pytest.raises(PreflightError) as err:
        run(api)
    assert "create pytorchjobs" in str(err.value) and "get pods/log" in str(err.value)
    assert "rbac.yaml" in str(err.value)
    assert api.created == []


def test_no_credentials_or_unreachable_api_is_a_preflight_error(tmp_path: Path):
    with pytest.raises(PreflightError, match="no Kubernetes credentials"):
        run_job(spec(), backend="kubernetes", config_file=str(tmp_path / "missing-kubeconfig"))
    cfg = k8s.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg.retries = 0
    with pytest.raises(
        PreflightError, match="cannot reach the Kubernetes API at http://127.0.0.1:9"
    ):
        run_job(spec(), backend="kubernetes", client_configuration=cfg, **FAST)


def test_missing_namespace_fails_preflight(fake_api):
    api = fake_api()
    with pytest.raises(PreflightError, match="namespace 'nowhere' does not exist"):
        run(api, spec(namespace="nowhere"))


def test_namespace_unreadable_falls_back_to_the_create_answer(fake_api):
    api = fake_api(namespace_forbidden=True, scenario=succeed(lines=1))
    assert run(api).phase == "Succeeded"
    api2 = fake_api(namespace_forbidden=True)
    with pytest.raises(PreflightError, match="'nowhere' does not exist"):
        run(api2, spec(namespace="nowhere"))


def stuck_pending(op: Operator) -> None:
    op.condition("Created")
    pod = op.add_pod("Master", 0)
    op.unschedulable(pod, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
    op.sleep(60)


def test_pending_watchdog_fails_with_the_scheduler_message(fake_api):
    api = fake_api(scenario=stuck_pending)
    with pytest.raises(JobFailed) as err:
        run(api, spec(workers=1), pending_timeout_s=1.0, watchdog_fails=True)
    message = str(err.value)
    assert "Pending after 1 s" in message and "Insufficient nvidia.com/gpu" in message
    assert api.deleted == ["job"]


def test_pending_watchdog_reports_and_keeps_waiting(fake_api):
    def scenario(op: Operator) -> None:
        pod = op.add_pod("Master", 0)
        op.unschedulable(pod, "0/1 nodes are available: 1 Insufficient cpu.")
        op.sleep(2.5)
        op.running(pod)
        op.log(pod, "finally")
        op.terminate(pod)
        op.condition("Succeeded")

    api = fake_api(scenario=scenario)
    lines: list[str] = []
    result = run(api, spec(workers=1), lines, pending_timeout_s=1.0)
    assert result.phase == "Succeeded"
    assert len(result.watchdog) == 1 and "Insufficient cpu" in result.watchdog[0]
    assert any(x.startswith("[launcher] watchdog: pods still Pending") for x in lines)


def test_silence_watchdog_catches_a_hang(fake_api):
    def scenario(op: Operator) -> None:
        pod = op.add_pod("Master", 0)
        op.running(pod)
        op.log(pod, "init process group ...")
        op.sleep(60)

    api = fake_api(scenario=scenario)
    with pytest.raises(JobFailed, match="no replica logged anything for 1 s"):
        run(api, spec(workers=1), silence_timeout_s=1.0, watchdog_fails=True)
    assert api.deleted == ["job"]


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys
    from kubernetes import client
    from components.pytorchjob import JobCancelled, TrainSpec, run_job

    cfg = client.Configuration()
    cfg.host = sys.argv[1]
    spec = TrainSpec(name="job", namespace="default", workers=2, run_id="run-1")
    try:
        run_job(spec, backend="kubernetes", client_configuration=cfg, poll_interval_s=1.0)
    except JobCancelled as exc:
        print("CANCELLED:", exc, flush=True)
        sys.exit(143)
    """
)


def test_sigterm_deletes_the_job_then_exits(fake_api, tmp_path: Path):
    api = fake_api(scenario=succeed(lines=200, delay=0.1))
    script = tmp_path / "launch.py"
    script.write_text(SIGTERM_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), api.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        api.wait_for(
            lambda: api.job("job") is not None and api.logs.get(("default", "job-master-0"))
        )
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert "CANCELLED" in out and "deleted PyTorchJob default/job (cancelled (SIGTERM))" in out
    assert "[master-0] step 0 from job-master-0" in out
    assert api.deleted == ["job"] and api.job("job") is None


def test_exit_handler_cleanup_deletes_only_this_runs_jobs(fake_api):
    api = fake_api()
    custom = k8s.CustomObjectsApi(k8s.ApiClient(api.configuration()))
    for name, run_id in (("a", "run-1"), ("b", "run-1"), ("c", "run-2")):
        custom.create_namespaced_custom_object(
            "kubeflow.org",
            "v1",
            "default",
            "pytorchjobs",
            build_pytorchjob(spec(name=name, run_id=run_id)),
        )
    assert (
        cleanup_step(
            run_id="run-1",
            namespace="default",
            backend="kubernetes",
            client_configuration=api.configuration(),
        )
        == 2
    )
    assert sorted(api.deleted) == ["a", "b"] and api.job("c") is not None
    assert cleanup_step(run_id="run-1", namespace="default", backend="local") == 0


# -- RBAC: the Role grants exactly what the backend calls ---------------------------------------


def rbac_rules() -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
    namespaced, cluster = set(), set()
    for doc in yaml.safe_load_all(RBAC_FILE.read_text()):
        target = {"Role": namespaced, "ClusterRole": cluster}.get(doc["kind"])
        for rule in doc.get("rules", []) if target is not None else []:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    target.update((g, r, v) for v in rule["verbs"])
    return namespaced, cluster


def test_rbac_yaml_matches_the_permissions_the_backend_checks():
    namespaced, cluster = rbac_rules()
    assert namespaced == set(REQUIRED_PERMISSIONS)
    assert cluster == set(CLUSTER_PERMISSIONS)  # SSAR is cluster-scoped: a ClusterRole
    kinds = [d["kind"] for d in yaml.safe_load_all(RBAC_FILE.read_text())]
    assert kinds == ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
    docs = rbac_documents(namespace="team-a", service_account="runner")
    role, binding, _, cluster_binding = docs
    assert role["metadata"]["namespace"] == "team-a" == binding["metadata"]["namespace"]
    for b in (binding, cluster_binding):
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "runner", "namespace": "team-a"}
        ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_backend_calls_exactly_what_rbac_grants(fake_api):
    """Success, failure, re-attach and cleanup together use every granted verb and no other."""
    used: set[tuple[str, str, str]] = set()
    api = fake_api(scenario=succeed(lines=1))
    run(api)
    used |= api.calls
    api = fake_api(scenario=failing_worker("Error", 1))
    with pytest.raises(JobFailed):
        run(api)
    used |= api.calls
    api = fake_api(scenario=succeed(lines=1))
    k8s.CustomObjectsApi(k8s.ApiClient(api.configuration())).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", build_pytorchjob(spec())
    )
    used |= {c for c in api.calls if c[2] != "create"}  # that create was the test's
    api.calls.clear()
    run(api)
    cleanup_step(
        run_id="run-1",
        namespace="default",
        backend="kubernetes",
        client_configuration=api.configuration(),
    )
    used |= api.calls
    namespaced, cluster = rbac_rules()
    # Reading the namespace is optional pre-flight (a 403 falls back to create's answer).
    assert used - {("", "namespaces", "get")} == namespaced | cluster
