"""Pod Security admission judges the pods the real controllers create from our jobs.

Each job is submitted to a namespace that enforces a Pod Security Standard
(``pod-security.kubernetes.io/enforce``); Kubeflow Trainer (through JobSet and the Job
controller) or the Training Operator then creates the pods — with their init containers, ours
(data staging) and the operator's (``init-pytorch``) — and the API server admits or refuses each.
The pods the controllers made keep what the launcher asked for: every container's read-only root
file system, and the emptyDirs at /tmp and HOME with HOME and TMPDIR pointing there.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from components.launcher import SpecError, TrainSpec, job_api
from components.launcher.spec import STAGE_ROOT
from tests.cluster.play import JOB_LABEL
from tests.launcher.k8s_helpers import PROGRAMS
from tests.launcher.read_only_root import WRITTEN_BY_EVERY_CONTAINER, container_problems

STAGED = {"stage_data_uri": "s3://data/cats", "stage_data_digest": "0f3a" * 16}
VARIANTS = {
    "cpu": {},
    "gpu": {"gpus_per_worker": 1},
    "staged": STAGED,
    "shared-volume": {"pvcs": ["kfp-ddp-workspace:/workspace"]},
}


@pytest.fixture(params=["baseline", "restricted"])
def level(request) -> str:
    return request.param


@pytest.fixture
def enforcing(cluster, level, request):
    """A namespace of the whole plane enforcing ``level``."""
    name = cluster.create_namespace(request.node.name, pod_security=level)
    yield name
    cluster.clear_namespace(name)


def job_spec(namespace: str, api: str, **kw: Any) -> TrainSpec:
    base = {"api": api, "name": "job", "namespace": namespace, "workers": 2, "run_id": "r"}
    return TrainSpec.flat(**(base | PROGRAMS.get(api, {}) | kw))


def submit(cluster, s: TrainSpec) -> None:
    api = job_api(s.api)
    client.CustomObjectsApi(cluster.clients()).create_namespaced_custom_object(
        api.group, api.version, s.namespace, api.plural, api.build(s), field_validation="Strict"
    )


def admission(cluster, s: TrainSpec, pods: int, timeout: float = 30.0) -> tuple[str, str]:
    """("admitted", "") once the controller created ``pods`` pods, or ("refused", why) when the
    API server refused one (the controller's event says why)."""
    core = client.CoreV1Api(cluster.clients())
    selector = f"{JOB_LABEL[s.api]}={s.name}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(core.list_namespaced_pod(s.namespace, label_selector=selector).items) >= pods:
            return "admitted", ""
        for event in core.list_namespaced_event(s.namespace).items:
            if "violates PodSecurity" in (event.message or ""):
                return "refused", event.message
        time.sleep(0.2)
    raise TimeoutError(f"neither {pods} pods nor a refusal for {s.api} {s.name} in {timeout} s")


def pods_of(cluster, s: TrainSpec) -> list[dict[str, Any]]:
    """The job's pods as the controllers created them (API JSON)."""
    core = client.CoreV1Api(cluster.clients())
    found = core.list_namespaced_pod(s.namespace, label_selector=f"{JOB_LABEL[s.api]}={s.name}")
    return [client.ApiClient().sanitize_for_serialization(pod) for pod in found.items]


def read_only_root_problems(pod: dict[str, Any], s: TrainSpec) -> list[str]:
    """What a controller-made pod lacks of the read-only root the launcher rendered (every
    container, the controllers' own included) and of the volumes its programs write to."""
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    written = list(WRITTEN_BY_EVERY_CONTAINER) + ([STAGE_ROOT] if s.stage_data_uri else [])
    problems = []
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        problems += container_problems(container, volumes, written)
        env = {e["name"] for e in container.get("env") or []}
        if not {"HOME", "TMPDIR"} <= env:
            problems.append(f"{container['name']}: no HOME or TMPDIR in {sorted(env)}")
    for scratch in ("tmp", "home"):
        if "emptyDir" not in volumes.get(scratch, {}):
            problems.append(f"{pod['metadata']['name']}: no emptyDir {scratch!r}")
    return problems


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("api", ["trainjob", "pytorchjob", "tfjob", "xgboostjob"])
def test_the_pods_of_every_job_pass_pod_security(cluster, enforcing, level, api, variant, request):
    s = job_spec(enforcing, api, **VARIANTS[variant])
    submit(cluster, s)
    verdict, why = admission(cluster, s, pods=2)
    assert verdict == "admitted", why
    pods = pods_of(cluster, s)
    assert len(pods) == 2
    for pod in pods:
        assert read_only_root_problems(pod, s) == [], pod["metadata"]["name"]


def test_ipc_lock_is_an_explicit_opt_in_that_needs_a_privileged_namespace(cluster, request):
    """IPC_LOCK (RDMA memory registration) is a capability even baseline refuses: the spec
    refuses it below pod_security=privileged, naming the level; a restricted namespace refuses
    such pods; a privileged namespace admits them."""
    with pytest.raises(SpecError, match="pod_security=privileged.*enforce: privileged"):
        job_spec("default", "pytorchjob", capabilities=["IPC_LOCK"])
    for level, expected in (("restricted", "refused"), ("privileged", "admitted")):
        namespace = cluster.create_namespace(f"{request.node.name}-{level}", pod_security=level)
        try:
            s = job_spec(
                namespace,
                "pytorchjob",
                nccl_preset="infiniband",
                capabilities=["IPC_LOCK"],
                pod_security="privileged",
                gpus_per_worker=1,
            )
            submit(cluster, s)
            verdict, why = admission(cluster, s, pods=2)
            assert verdict == expected, why
            if expected == "refused":
                assert "IPC_LOCK" in why
        finally:
            cluster.clear_namespace(namespace)


def test_the_infiniband_preset_alone_stays_restricted(cluster, enforcing, level):
    s = job_spec(enforcing, "trainjob", nccl_preset="infiniband", gpus_per_worker=1)
    assert any("IPC_LOCK" in w for w in s.warnings())  # says what RDMA may still need
    submit(cluster, s)
    verdict, why = admission(cluster, s, pods=2)
    assert verdict == "admitted", why


def test_a_master_layout_needs_the_operators_init_template_under_restricted(
    cluster, clusters, request
):
    """pytorch_master=True: the v1.9 operator adds init-pytorch to every Worker. Its built-in
    container (the whole plane's operator) is refused under restricted; with the template we
    ship, given to the operator as an admin would (the operator-only plane), it is admitted."""
    from tests.cluster.plugin import OPERATOR_ONLY

    for plane, expected in ((cluster, "refused"), (clusters.get(OPERATOR_ONLY), "admitted")):
        namespace = plane.create_namespace(request.node.name, pod_security="restricted")
        try:
            s = job_spec(namespace, "pytorchjob", pytorch_master=True)
            assert any("init-pytorch" in w for w in s.warnings())
            submit(plane, s)
            verdict, why = admission(plane, s, pods=2)
            assert verdict == expected, why
            if expected == "refused":
                assert 'container "init-pytorch"' in why
            else:
                (worker,) = [
                    p
                    for p in client.CoreV1Api(plane.clients()).list_namespaced_pod(namespace).items
                    if p.metadata.labels.get("training.kubeflow.org/replica-type") == "worker"
                ]
                assert [c.name for c in worker.spec.init_containers] == ["init-pytorch"]
                # The template we ship: the operator's container has a read-only root too.
                (init,) = worker.spec.init_containers
                assert init.security_context.read_only_root_filesystem is True
        finally:
            plane.clear_namespace(namespace)
