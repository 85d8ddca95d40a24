"""The exit handler's cleanup of a run's jobs (every API), and RBAC = exactly what is called."""

from __future__ import annotations

import pytest
import yaml

from components.launcher import JobFailed, TrainSpec
from components.launcher.backends.kubernetes import delete_run_jobs, granted_permissions
from components.launcher.options import KubernetesOptions
from components.launcher.rbac import RBAC_FILE, rbac_documents, render_rbac
from components.launcher.step import cleanup_step
from tests.launcher.conftest import succeed
from tests.launcher.test_k8s_backend import ALL_APIS, create_directly, failing_node, run, spec


def cleanup(fake, run_id: str) -> int:
    options = KubernetesOptions(client_configuration=fake.configuration())
    return cleanup_step(run_id=run_id, namespace="default", backend="kubernetes", options=options)


def test_exit_handler_cleanup_deletes_only_this_runs_jobs_of_every_api(fake_api):
    fake = fake_api()
    for name, api, run_id in (
        ("a", "trainjob", "run-1"),
        ("b", "pytorchjob", "run-1"),
        ("c", "trainjob", "run-2"),
        ("d", "tfjob", "run-1"),
        ("e", "tfjob", "run-2"),
    ):
        create_directly(fake, spec(api, name=name, run_id=run_id))
    failed = spec("pytorchjob", name="f", run_id="run-1")
    create_directly(fake, failed)
    job = fake.get("pytorchjobs", "default", "f")
    job["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "X"}]}
    fake.put("pytorchjobs", job, "MODIFIED")
    assert cleanup(fake, "run-1") == 3
    assert sorted(fake.deleted) == ["a", "b", "d"]
    assert fake.job("c") is not None and fake.job("e") is not None
    assert fake.job("f") is not None  # a failed job is kept for inspection
    assert cleanup(fake, "run-1") == 0  # nothing left: nothing deleted, nothing claimed
    assert cleanup_step(run_id="run-1", namespace="default", backend="local") == 0


def test_cleanup_goes_on_past_a_kind_the_role_may_not_list(fake_api):
    """A Role applied before tfjobs were in rbac.yaml: the other kinds are still cleaned up."""
    fake = fake_api(denied={("list", "tfjobs")})
    create_directly(fake, spec("pytorchjob", name="a", run_id="r"))
    lines: list[str] = []
    options = KubernetesOptions(client_configuration=fake.configuration(), log=lines.append)
    assert delete_run_jobs("default", "r", options=options) == ["PyTorchJob/a"]
    assert any("may not list tfjobs in 'default' (HTTP 403)" in x for x in lines)
    assert any("rbac.yaml" in x for x in lines)


def test_cleanup_skips_an_api_the_cluster_does_not_serve(fake_api):
    fake = fake_api(served=("pytorchjob",))
    create_directly(fake, TrainSpec(api="pytorchjob", name="a", namespace="default", run_id="r"))
    assert cleanup(fake, "r") == 1
    assert ("trainer.kubeflow.org", "trainjobs", "list") not in fake.calls


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
    role, binding = rbac_documents(namespace="team-a", service_account="runner")
    assert role["metadata"]["namespace"] == "team-a" == binding["metadata"]["namespace"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "runner", "namespace": "team-a"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_backend_calls_exactly_what_rbac_grants(fake_api):
    """Success, failure, re-attach, a namespaced runtime, cleanup and the monitoring objects of
    metrics_port, with every API (TrainJob, PyTorchJob, TFJob), together use every granted verb
    and no other (discovery and the optional reads aside)."""
    used: set[tuple[str, str, str]] = set()
    for api in ALL_APIS:
        fake = fake_api(scenario=succeed(lines=1))
        run(fake, spec(api))
        used |= fake.calls
        fake = fake_api(scenario=failing_node("Error", 1))
        with pytest.raises(JobFailed):
            run(fake, spec(api))
        used |= fake.calls
        fake = fake_api(scenario=succeed(lines=1))
        create_directly(fake, spec(api))
        used |= {c for c in fake.calls if c[2] != "create"}  # that create was the test's
        fake.calls.clear()
        run(fake, spec(api))
        cleanup(fake, "run-1")
        used |= fake.calls
    fake = fake_api(scenario=succeed(lines=1), namespaced_runtimes=(("default", "mine"),))
    run(fake, spec("trainjob", runtime_kind="TrainingRuntime", runtime_name="mine"))
    used |= fake.calls
    for monitor in ("podmonitor", "servicemonitor"):  # metrics_port: the monitoring objects
        fake = fake_api(scenario=succeed(lines=1))
        run(fake, spec("pytorchjob", metrics_port=9400, metrics_monitor=monitor))
        used |= fake.calls
    optional = {
        ("", "namespaces", "get"),  # a 403 falls back to create's answer
        ("trainer.kubeflow.org", "clustertrainingruntimes", "get"),  # a 403 is only noted
        ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),  # every user may
    }
    assert used - optional == granted_permissions()
