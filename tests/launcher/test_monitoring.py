"""``metrics_port``: ports, scrape annotations, the PodMonitor / ServiceMonitor and PrometheusRule
(valid against the official Prometheus Operator CRDs, strictly), render, and the kubernetes
backend creating them owned by the job (deleted with it by the real garbage collector) on the
real control plane."""

from __future__ import annotations

import time

import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client as k8s

from components.launcher import SpecError, build_manifest
from components.launcher.__main__ import cli
from components.launcher.monitoring import PORT_ANNOTATION, SCRAPE_ANNOTATION
from components.launcher.monitoring_documents import hang_expression, monitoring_documents
from tests.cluster.play import JobPods
from tests.crds import require_crd, schema_errors
from tests.launcher.k8s_helpers import (
    ALL_APIS,
    APIS,
    MONITOR_ACCOUNT,
    PROGRAMS,
    created,
    role_without,
    run,
    servicemonitor_account,
    spec,
    succeed,
)

REPLICAS = {
    "pytorchjob": "pytorchReplicaSpecs",
    "tfjob": "tfReplicaSpecs",
    "xgboostjob": "xgbReplicaSpecs",
}
USERS_PROGRAM = tuple(PROGRAMS)
"""APIs that run the user's program, one process per pod (no trainer flags)."""
OWN_PORTS = {"xgboostjob": [{"name": "xgboostjob-port", "containerPort": 9999, "protocol": "TCP"}]}
"""Ports an API's container declares besides the metrics ports."""


def containers(manifest: dict) -> list[dict]:
    """The training container of every replica (a TrainJob: its trainer)."""
    if manifest["kind"] == "TrainJob":
        return [manifest["spec"]["trainer"]]
    replicas = manifest["spec"][REPLICAS[manifest["kind"].lower()]].values()
    return [r["template"]["spec"]["containers"][0] for r in replicas]


def pod_annotations(manifest: dict) -> list[dict]:
    if manifest["kind"] == "TrainJob":
        (patch,) = manifest["spec"]["runtimePatches"]
        (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        return [node["template"]["spec"]["template"]["metadata"]["annotations"]]
    replicas = manifest["spec"][REPLICAS[manifest["kind"].lower()]].values()
    return [r["template"]["metadata"]["annotations"] for r in replicas]


def assert_valid_service(document: dict) -> None:
    """No CRD for a core Service: it must survive the kubernetes client's V1Service model."""
    api = k8s.ApiClient()
    model = api._ApiClient__deserialize(document, "V1Service")  # the client's own decoding
    assert api.sanitize_for_serialization(model) == document


@pytest.mark.parametrize("monitor", ["podmonitor", "servicemonitor"])
@pytest.mark.parametrize("api", ALL_APIS)
def test_documents_are_valid_against_the_official_crds(api, monitor):
    for kind in ("podmonitor", "servicemonitor", "prometheusrule", api):
        require_crd(kind)
    nproc = 1 if api in USERS_PROGRAM else 2  # a TFJob runs one process per pod
    s = spec(
        "default",
        api,
        nproc_per_node=nproc,
        metrics_port=9400,
        metrics_monitor=monitor,
        namespace="ml",
    )
    job = build_manifest(s)
    assert schema_errors(api, job) == []
    documents = monitoring_documents(s)
    kinds = [d["kind"] for d in documents]
    expected = ["PodMonitor"] if monitor == "podmonitor" else ["Service", "ServiceMonitor"]
    assert kinds == [*expected, "PrometheusRule"]
    for document in documents:
        assert document["metadata"]["namespace"] == "ml"
        assert document["metadata"]["labels"]["kfp-ddp.io/run-id"] == "run-1"
        if document["kind"] == "Service":
            assert_valid_service(document)
            assert document["spec"]["selector"]  # never every pod of the namespace
        else:
            assert schema_errors(document["kind"].lower(), document) == []


@pytest.mark.parametrize("api", ALL_APIS)
def test_every_replica_opens_the_ports_and_is_annotated(api):
    s = spec(
        "default",
        api,
        workers=3,
        metrics_port=9400,
        **({} if api in USERS_PROGRAM else {"nproc_per_node": 2}),
    )
    job = build_manifest(s)
    for found in pod_annotations(job):
        assert found[SCRAPE_ANNOTATION] == "true" and found[PORT_ANNOTATION] == "9400"
    for container in containers(job):
        if api != "trainjob":  # a TrainJob's runtime patches cannot declare ports
            ports = [{"name": "metrics-0", "containerPort": 9400, "protocol": "TCP"}]
            if api == "pytorchjob":
                ports.append({"name": "metrics-1", "containerPort": 9401, "protocol": "TCP"})
            assert container["ports"] == OWN_PORTS.get(api, []) + ports
        args = container.get("args") or []
        if api in USERS_PROGRAM:  # the user's program: no trainer flags
            assert "--metrics-port" not in args
        else:
            assert args[-4:] == ["--metrics-port", "9400", "--metrics-job", "job"]
    (monitor, _rule) = monitoring_documents(s)
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert len(endpoints) == (1 if api in USERS_PROGRAM else 2)
    assert all(e["honorLabels"] for e in endpoints)
    if api == "trainjob":
        addresses = [e["relabelings"][2]["replacement"] for e in endpoints]
        assert addresses == ["$1:9400", "$1:9401"]
        assert monitor["spec"]["selector"]["matchLabels"] == {
            "jobset.sigs.k8s.io/jobset-name": "job",
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
        }
    else:
        assert [e["port"] for e in endpoints] == [p["name"] for p in ports]
        assert monitor["spec"]["selector"]["matchLabels"] == {
            "training.kubeflow.org/job-name": "job"
        }


def test_without_metrics_port_nothing_changes():
    s = spec("default", "pytorchjob")
    assert monitoring_documents(s) == []
    job = build_manifest(s)
    assert all("ports" not in c for c in containers(job))
    assert all(SCRAPE_ANNOTATION not in a for a in pod_annotations(job))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"metrics_port": 80}, "use a port from 1024"),
        ({"metrics_port": 65535, "nproc_per_node": 2}, "65535..65536"),
        ({"metrics_port": 29499, "nproc_per_node": 2}, "rendezvous port 29500"),
        (
            {"metrics_port": 9400, "args": ["--metrics-port", "9"]},
            "set metrics_port, not --metrics-port",
        ),
        ({"metrics_port": 9400, "metrics_monitor": "prometheus"}, "podmonitor, servicemonitor"),
        ({"hang_alert_s": 0}, "hang_alert_s"),
    ],
)
def test_bad_monitoring_settings_are_refused_naming_the_field(fields, message):
    with pytest.raises(SpecError, match=message):
        spec("default", "pytorchjob", **fields)


def test_the_hang_alert_selects_the_jobs_series():
    s = spec(
        "default", "trainjob", metrics_port=9400, hang_alert_s=120, namespace="ml", name="cats"
    )
    assert hang_expression(s) == (
        'max by (namespace, job) (kfp_ddp_train_seconds_since_last_step{namespace="ml", '
        'job="cats"}) > 120'
    )


def test_render_prints_the_job_then_the_monitoring_documents():
    result = CliRunner().invoke(
        cli, ["render", "--api", "pytorchjob", "--name", "cats", "--metrics-port", "9400"]
    )
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in documents] == ["PyTorchJob", "PodMonitor", "PrometheusRule"]
    plain = CliRunner().invoke(cli, ["render", "--api", "pytorchjob", "--name", "cats"])
    assert [d["kind"] for d in yaml.safe_load_all(plain.stdout)] == ["PyTorchJob"]


# -- the kubernetes backend (the real API server, garbage collector and RBAC) ---------------------


def monitoring_objects(ns) -> dict[str, list[dict]]:
    from kubernetes import client

    custom = client.CustomObjectsApi(ns.admin())
    found = {
        plural: custom.list_namespaced_custom_object(
            "monitoring.coreos.com", "v1", ns.name, plural
        )["items"]
        for plural in ("podmonitors", "servicemonitors", "prometheusrules")
    }
    found["services"] = [
        s.to_dict() for s in client.CoreV1Api(ns.admin()).list_namespaced_service(ns.name).items
    ]
    return found


def wait_until_collected(ns, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(monitoring_objects(ns).values()):
        assert time.monotonic() < deadline, monitoring_objects(ns)
        time.sleep(0.2)


@pytest.mark.parametrize("api", APIS)
def test_the_backend_creates_them_owned_by_the_job_and_they_go_with_it(k8s, api):
    seen: dict[str, list[dict]] = {}

    def scenario(job: JobPods) -> None:
        pods = job.pods(2)
        for pod in pods:
            job.run(pod)
        job.wait_until(lambda: len(monitoring_objects(k8s)["prometheusrules"]) == 1)
        seen.update(monitoring_objects(k8s))
        seen["job"] = [job.job_object()]
        for pod in reversed(pods):
            job.exit(pod)

    lines: list[str] = []
    run(k8s, spec(k8s, api, metrics_port=9400, hang_alert_s=300), lines, scenario)
    (job,) = seen["job"]
    (monitor,) = seen["podmonitors"]
    (rule,) = seen["prometheusrules"]
    assert (monitor["metadata"]["name"], rule["metadata"]["name"]) == ("job-metrics", "job-alerts")
    for obj in (monitor, rule):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == job["metadata"]["uid"] and owner["kind"] == job["kind"]
    assert any(f"created PodMonitor {k8s.name}/job-metrics" in line for line in lines)
    # cleanup=on-success deleted the job; the garbage collector takes its monitoring objects
    wait_until_collected(k8s)


def test_servicemonitor_alternative_creates_a_service_too(k8s):
    """As an account bound to the Role rendered with --servicemonitor (the default Role grants
    no Services)."""
    run(
        k8s,
        spec(k8s, "trainjob", metrics_port=9400, metrics_monitor="servicemonitor"),
        None,
        succeed(lines=1),
        configuration=servicemonitor_account(k8s),
    )
    kinds = [m["kind"] for m in created(k8s, MONITOR_ACCOUNT)]
    assert kinds == ["TrainJob", "Service", "ServiceMonitor", "PrometheusRule"]
    wait_until_collected(k8s)


def test_a_cluster_without_the_prometheus_operator_still_trains(operator_k8s):
    lines: list[str] = []
    s = spec(operator_k8s, "pytorchjob", metrics_port=9400)
    result = run(operator_k8s, s, lines, succeed(lines=1))
    assert result.phase == "Succeeded"
    assert any("serves no monitoring.coreos.com/v1 PodMonitor" in line for line in lines)


def test_a_role_without_the_monitoring_rules_still_trains(k8s):
    configuration = k8s.launcher_configuration(
        documents=role_without(k8s.name, ("create", "prometheusrules"))
    )
    lines: list[str] = []
    s = spec(k8s, "trainjob", metrics_port=9400)
    result = run(k8s, s, lines, succeed(lines=1), configuration=configuration)
    assert result.phase == "Succeeded"
    assert any("PrometheusRule" in x and "not created" in x and "rbac" in x for x in lines)
    assert any("created PodMonitor" in line for line in lines)


def test_a_rayjobs_workers_are_scraped_by_pod_ip_and_port():
    """KubeRay owns the Ray container's ports (its "metrics" is Ray's own): the PodMonitor keeps
    the worker pods' ``ray`` container and scrapes each local rank's port by the pod's IP."""
    require_crd("podmonitor")
    s = spec("default", "rayjob", workers=2, nproc_per_node=2, metrics_port=9400)
    (monitor, _rule) = monitoring_documents(s)
    assert schema_errors("podmonitor", monitor) == []
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "kfp-ddp.io/ray-job": "job",
        "ray.io/node-type": "worker",
    }
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [e["relabelings"][2]["replacement"] for e in endpoints] == ["$1:9400", "$1:9401"]
    assert endpoints[0]["relabelings"][0]["regex"] == "ray"
    manifest = build_manifest(s)
    (group,) = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (ray,) = group["template"]["spec"]["containers"]
    assert "ports" not in ray  # KubeRay adds its own
    assert "--metrics-port 9400" in manifest["spec"]["entrypoint"]
