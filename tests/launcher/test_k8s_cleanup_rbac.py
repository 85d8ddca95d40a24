"""The exit handler's cleanup of a run's jobs (every API), and RBAC: the launcher runs as a
ServiceAccount bound to the rendered Role on the real API server, and its audit log shows that
the calls it makes are exactly what the Role grants."""

from __future__ import annotations

import time

import pytest
import yaml

from components.launcher import JobFailed, KubernetesOptions, PreflightError
from components.launcher.backends.kubernetes import delete_run_jobs, granted_permissions
from components.launcher.rbac import RBAC_FILE, rbac_documents, render_rbac
from components.launcher.step import cleanup_step
from tests.cluster.play import JobPods
from tests.launcher.k8s_helpers import (
    ALL_APIS,
    MONITOR_ACCOUNT,
    OPTIONAL_READS,
    calls,
    create_directly,
    install_namespaced_runtime,
    jobs,
    once_recreated,
    play_mpijob,
    play_rayjob_status,
    role_without,
    run,
    servicemonitor_account,
    spec,
    succeed,
)
from tests.launcher.test_k8s_backend import oom_until_failed
from tests.launcher.test_manifest_mpijob import MPI_IMAGE


def cleanup(ns, run_id: str, configuration=None) -> int:
    options = KubernetesOptions(
        client_configuration=configuration or ns.launcher_configuration(), log=lambda _: None
    )
    return cleanup_step(run_id=run_id, namespace=ns.name, backend="kubernetes", options=options)


def names(ns, api: str) -> set[str]:
    return {j["metadata"]["name"] for j in jobs(ns, api)}


def fail_the_master(job: JobPods) -> None:
    """Exit 1 under ExitCode: the Training Operator fails the PyTorchJob."""
    (master,) = job.pods(1)
    job.run(master)
    job.exit(master, 1, reason="Error")
    job.wait_until(lambda: "Failed" in conditions(job.job_object()))


def conditions(job: dict | None) -> set[str]:
    found = (job or {}).get("status", {}).get("conditions") or []
    return {c["type"] for c in found if c.get("status") == "True"}


def test_exit_handler_cleanup_deletes_only_this_runs_jobs_of_every_api(k8s):
    for name, api, run_id in (
        ("a", "trainjob", "run-1"),
        ("b", "pytorchjob", "run-1"),
        ("c", "trainjob", "run-2"),
        ("d", "tfjob", "run-1"),
        ("e", "tfjob", "run-2"),
        ("f", "pytorchjob", "run-1"),
    ):
        create_directly(k8s, spec(k8s, api, name=name, run_id=run_id, workers=1))
    fail_the_master(k8s.job("pytorchjob", "f"))  # the real operator marks it Failed
    assert cleanup(k8s, "run-1") == 3
    deadline = time.monotonic() + 30
    while names(k8s, "trainjob") != {"c"} or names(k8s, "tfjob") != {"e"}:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert names(k8s, "pytorchjob") == {"f"}  # a failed job is kept for inspection
    assert cleanup(k8s, "run-1") == 0  # nothing left: nothing deleted, nothing claimed
    assert cleanup_step(run_id="run-1", namespace=k8s.name, backend="local") == 0


def test_cleanup_goes_on_past_a_kind_the_role_may_not_list(k8s):
    """A Role applied before tfjobs were in rbac.yaml: the other kinds are still cleaned up."""
    create_directly(k8s, spec(k8s, "pytorchjob", name="a", run_id="r", workers=1))
    configuration = k8s.launcher_configuration(documents=role_without(k8s.name, ("list", "tfjobs")))
    lines: list[str] = []
    options = KubernetesOptions(client_configuration=configuration, log=lines.append)
    assert delete_run_jobs(k8s.name, "r", options=options) == ["PyTorchJob/a"]
    assert any(f"may not list tfjobs in '{k8s.name}' (HTTP 403)" in x for x in lines)
    assert any("rbac.yaml" in x for x in lines)


def test_cleanup_skips_an_api_the_cluster_does_not_serve(operator_k8s):
    create_directly(operator_k8s, spec(operator_k8s, "pytorchjob", name="a", run_id="r"))
    assert cleanup(operator_k8s, "r") == 1  # no TrainJob API there: not asked, no error
    assert ("trainer.kubeflow.org", "trainjobs", "list") not in calls(operator_k8s)


# -- RBAC: the Role grants exactly what the backend calls ---------------------------------------


def rbac_rules(docs) -> set[tuple[str, str, str]]:
    granted = set()
    for doc in docs:
        assert doc["kind"] in ("Role", "RoleBinding"), doc["kind"]  # no ClusterRole
        for rule in doc.get("rules", []):
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    granted.update((g, r, v) for v in rule["verbs"])
    return granted


def test_rbac_yaml_is_the_rendering_of_the_permissions():
    docs = list(yaml.safe_load_all(RBAC_FILE.read_text()))
    assert RBAC_FILE.read_text() == render_rbac()
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding"]
    assert rbac_rules(docs) == granted_permissions()
    # Least privilege: no Services (LoadBalancers!) unless the ServiceMonitor mode is chosen.
    assert not any(resource == "services" for _, resource, _ in granted_permissions())
    monitor = rbac_rules(rbac_documents(servicemonitor=True))
    assert monitor - rbac_rules(docs) == {
        ("", "services", "create"),
        ("monitoring.coreos.com", "servicemonitors", "create"),
    }
    text = render_rbac(namespace="team-a", service_account="default-editor")
    assert "NAMESPACE: team-a" in text and "SERVICE ACCOUNT: default-editor" in text
    assert "NAMESPACE: kubeflow" not in text
    role, binding = rbac_documents(namespace="team-a", service_account="runner")
    assert role["metadata"]["namespace"] == "team-a" == binding["metadata"]["namespace"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "runner", "namespace": "team-a"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def failing(job: JobPods) -> None:
    """A node exits 1, permanent: under ExitCode (PyTorchJob) the operator fails the job; under
    OnFailure (TrainJob, TFJob) the kubelet restarts the container and the launcher stops it."""
    pods = job.pods(2)
    for pod in pods:
        job.run(pod)
    job.sleep(0.3)
    if job.api == "pytorchjob":
        job.exit(pods[1], 1, reason="Error")
    else:
        job.crash(pods[1], 1)
    job.sleep(60)


def test_the_optional_cluster_runtime_reader_lets_preflight_find_a_missing_runtime(k8s):
    documents = rbac_documents(
        namespace=k8s.name, service_account="reader", cluster_runtime_reader=True
    )
    assert [d["kind"] for d in documents][2:] == ["ClusterRole", "ClusterRoleBinding"]
    configuration = k8s.launcher_configuration(service_account="reader", documents=documents)
    with pytest.raises(PreflightError, match="ClusterTrainingRuntime 'nope' does not exist"):
        run(k8s, spec(k8s, "trainjob", runtime_name="nope"), configuration=configuration)


def test_without_servicemonitor_mode_no_service_can_be_created_and_training_goes_on(k8s):
    lines: list[str] = []
    s = spec(k8s, "trainjob", metrics_port=9400, metrics_monitor="servicemonitor")
    assert run(k8s, s, lines, succeed(lines=1)).phase == "Succeeded"
    assert any("Service" in x and "not created" in x and "forbidden" in x for x in lines), lines
    assert ("", "services", "create") in calls(k8s)  # asked, and refused by the real RBAC


def test_the_backend_calls_exactly_what_rbac_grants(k8s):
    """Success, failure, re-attach, a namespaced runtime, cleanup and the monitoring objects of
    metrics_port, with every API, run as the rendered Role's ServiceAccount: every call is
    allowed (a 403 would fail the run), and together they use every granted verb and no other
    (the API server's audit log; discovery and the optional reads aside)."""
    for api in ALL_APIS:
        run(k8s, spec(k8s, api, name=f"ok-{api}"), None, succeed(lines=1))
        with pytest.raises(JobFailed):
            run(k8s, spec(k8s, api, name=f"bad-{api}"), None, failing)
        s = spec(k8s, api, name=f"again-{api}", run_id="run-2")
        create_directly(k8s, s)
        run(k8s, s, None, succeed(lines=1))
        cleanup(k8s, "run-1")
    # A retryable failure, created again once the old JobSet's Jobs are gone (listed).
    s = spec(k8s, "trainjob", name="oom", workers=1)
    with pytest.raises(JobFailed, match="OOMKilled"):
        run(k8s, s, None, oom_until_failed)
    (old,) = [j for j in jobs(k8s, "trainjob") if j["metadata"]["name"] == "oom"]
    run(k8s, s, None, once_recreated(old, succeed(workers=1, lines=1)))
    # A RayJob: KubeRay's verdict played (its dashboard is not served here).
    done = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    play_rayjob_status(k8s, "ok-rayjob", done, after_watch=True)  # the Role's watch, used
    run(k8s, spec(k8s, "rayjob", name="ok-rayjob"))
    failed = {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "reason": "AppFailed",
        "message": "Job entrypoint command failed with exit code 2, last available logs: ...",
    }
    play_rayjob_status(k8s, "bad-rayjob", failed)
    with pytest.raises(JobFailed, match="AppFailed"):  # exit 2: recorded as permanent (patch)
        run(k8s, spec(k8s, "rayjob", name="bad-rayjob"))
    s = spec(k8s, "rayjob", name="again-rayjob", run_id="run-2")
    create_directly(k8s, s)
    play_rayjob_status(k8s, "again-rayjob", done)
    run(k8s, s)  # re-attached (get)
    cleanup(k8s, "run-1")
    # An MPIJob: the operator and the launcher pod played (the real operator runs on the node's
    # plane only). Exit 2: recorded as permanent (patch).
    s = spec(k8s, "mpijob", name="ok-mpijob", image=MPI_IMAGE)
    play_mpijob(k8s, s, 0)
    run(k8s, s)
    s = spec(k8s, "mpijob", name="bad-mpijob", image=MPI_IMAGE)
    play_mpijob(k8s, s, 2)
    with pytest.raises(JobFailed, match="exit"):
        run(k8s, s)
    s = spec(k8s, "mpijob", name="again-mpijob", run_id="run-2", image=MPI_IMAGE)
    create_directly(k8s, s)
    play_mpijob(k8s, s, 0)
    run(k8s, s)  # re-attached (get)
    cleanup(k8s, "run-1")
    install_namespaced_runtime(k8s, "mine")
    s = spec(k8s, "trainjob", name="mine", runtime_kind="TrainingRuntime", runtime_name="mine")
    run(k8s, s, None, succeed(lines=1))
    lines: list[str] = []  # metrics_port: the monitoring objects
    s = spec(k8s, "pytorchjob", name="podmonitor", metrics_port=9400)
    run(k8s, s, lines, succeed(lines=1))
    # The ServiceMonitor mode, as an account bound to the Role rendered for it.
    s = spec(k8s, "pytorchjob", name="svcmon", metrics_port=9400, metrics_monitor="servicemonitor")
    run(k8s, s, lines, succeed(lines=1), configuration=servicemonitor_account(k8s))
    assert not any("not created" in x for x in lines), lines
    optional = OPTIONAL_READS
    assert calls(k8s) - optional == granted_permissions()
    monitor_only = calls(k8s, MONITOR_ACCOUNT) - optional - granted_permissions()
    assert monitor_only == granted_permissions(servicemonitor=True) - granted_permissions()
