"""XGBoost jobs turned into pods by the real controllers, every pod admitted under ``restricted``
Pod Security: a TrainJob on Kubeflow Trainer v2.3's ``xgboost-distributed`` runtime (its node
pods get the DMLC_* env, node 0 the tracker) and a Training Operator v1.9 XGBoostJob (Master +
Workers with MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE); and the pre-flight's reading of the
official runtimes' mlPolicy."""

from __future__ import annotations

import pytest
from kubernetes import client

from components.launcher import TrainSpec, build_trainjob, build_xgboostjob
from components.launcher.backends.kubernetes.preflight import check_policy, runtime_policy
from components.launcher.result import PreflightError
from tests.cluster.control_plane import TRAINER, load_documents
from tests.cluster.play import created_pods

PROGRAM = {"image": "registry.example.com/team/xgb:1", "command": ["python", "/app/train.py"]}
RUNTIMES = {
    "torch-distributed": "torch_distributed.yaml",
    "deepspeed-distributed": "deepspeed_distributed.yaml",
    "xgboost-distributed": "xgboost_distributed.yaml",
    "jax-distributed": "jax_distributed.yaml",
}


def runtime(name: str) -> dict:
    (document,) = load_documents(TRAINER / "runtimes" / RUNTIMES[name])
    return document


@pytest.fixture
def restricted(cluster, request):
    name = cluster.create_namespace(request.node.name, pod_security="restricted")
    cluster.plane.apply(load_documents(TRAINER / "runtimes" / RUNTIMES["xgboost-distributed"]))
    yield name
    cluster.clear_namespace(name)


def _env(pod) -> dict[str, str]:
    (container,) = pod.spec.containers
    return {
        e.name: e.value if e.value is not None else e.value_from.field_ref.field_path
        for e in container.env or []
        if e.value_from is None or e.value_from.field_ref is not None  # not the CPU request
    }


def _create(cluster, namespace: str, plural: str, group: str, version: str, manifest: dict):
    client.CustomObjectsApi(cluster.clients()).create_namespaced_custom_object(
        group, version, namespace, plural, manifest, field_validation="Strict"
    )


def test_an_xgboost_trainjob_becomes_nodes_with_the_dmlc_env(cluster, restricted):
    spec = TrainSpec.flat(
        api="trainjob",
        name="xgb",
        namespace=restricted,
        workers=3,
        run_id="r",
        runtime_name="xgboost-distributed",
        **PROGRAM,
    )
    _create(
        cluster, restricted, "trainjobs", "trainer.kubeflow.org", "v1alpha1", build_trainjob(spec)
    )
    pods = created_pods(cluster, restricted, "jobset.sigs.k8s.io/jobset-name=xgb", 3)
    for pod in pods:  # admitted under restricted: our pod security, patched into the runtime
        (container,) = pod.spec.containers
        assert container.image == PROGRAM["image"] and container.command == PROGRAM["command"]
        assert container.security_context.allow_privilege_escalation is False
        env = _env(pod)
        assert env["DMLC_TRACKER_URI"] == "xgb-node-0-0.xgb"  # node 0 runs the tracker
        assert env["DMLC_TRACKER_PORT"] == "29500" and env["DMLC_NUM_WORKER"] == "3"
        # the rank: each node's completion index, from the downward API
        assert "job-completion-index" in env["DMLC_TASK_ID"]
        assert 29500 in [p.container_port for p in container.ports or []]


def test_an_xgboostjob_becomes_a_master_and_workers_with_the_operators_env(cluster, restricted):
    spec = TrainSpec.flat(
        api="xgboostjob", name="xgbj", namespace=restricted, workers=3, run_id="r", **PROGRAM
    )
    _create(cluster, restricted, "xgboostjobs", "kubeflow.org", "v1", build_xgboostjob(spec))
    pods = created_pods(cluster, restricted, "training.kubeflow.org/job-name=xgbj", 3)
    ranks = {}
    for pod in pods:
        env = _env(pod)
        assert env["MASTER_ADDR"] == "xgbj-master-0" and env["MASTER_PORT"] == "9999"
        assert env["WORLD_SIZE"] == "3"
        assert env["WORKER_ADDRS"] == "xgbj-worker-0,xgbj-worker-1"
        ranks[pod.metadata.name] = env["RANK"]
    assert ranks == {"xgbj-master-0": "0", "xgbj-worker-0": "1", "xgbj-worker-1": "2"}


def test_the_preflight_reads_the_official_runtimes_policy():
    assert {name: runtime_policy(runtime(name)) for name in RUNTIMES} == {
        "torch-distributed": "torch",
        "deepspeed-distributed": "mpi",
        "xgboost-distributed": "xgboost",
        "jax-distributed": "jax",
    }
    xgb = TrainSpec.flat(api="trainjob", name="j", runtime_name="xgboost-distributed", **PROGRAM)
    check_policy(
        xgb, "ClusterTrainingRuntime", "xgboost-distributed", runtime("xgboost-distributed")
    )
    # A cluster whose runtime of that name is not what Trainer ships: refused, naming the fix.
    with pytest.raises(PreflightError, match="has mlPolicy torch, but Kubeflow Trainer's own"):
        check_policy(
            xgb, "ClusterTrainingRuntime", "xgboost-distributed", runtime("torch-distributed")
        )
    # A runtime of one's own, its policy unsaid: the user's program runs on it; ours does not.
    mine = TrainSpec.flat(api="trainjob", name="j", runtime_name="my-xgb", **PROGRAM)
    check_policy(mine, "ClusterTrainingRuntime", "my-xgb", runtime("xgboost-distributed"))
    ours = TrainSpec.flat(api="trainjob", name="j", runtime_name="my-xgb")
    with pytest.raises(PreflightError, match="our trainer runs under torchrun"):
        check_policy(ours, "ClusterTrainingRuntime", "my-xgb", runtime("xgboost-distributed"))
