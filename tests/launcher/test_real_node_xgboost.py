"""XGBoost on the real node, as users run it (the launcher's ServiceAccount with the rendered
Role, a namespace enforcing ``restricted``): the example program, in an image built on our CPU
image with xgboost and scikit-learn and pulled from the loopback registry, trains as 2 pods
around rank 0's tracker — an XGBoostJob (the Training Operator's Master + Worker, meeting at the
master's Service) and a TrainJob on Kubeflow Trainer's ``xgboost-distributed`` runtime (node 0's
JobSet hostname), started together, each in a namespace of its own (node_runs.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest

from components.launcher.backends.kubernetes import granted_permissions
from tests.cluster.control_plane import TRAINER, load_documents
from tests.cluster.plugin import Namespace
from tests.launcher.k8s_helpers import OPTIONAL_READS, calls, refused, spec
from tests.launcher.node_runs import SHARED_CPU, NodeRun, Planned, started_together

# One real node serves them all: files named test_real_node* run on one xdist worker.
pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.node_image("xgboost")]

APIS = {
    "xgboostjob": ({}, ["master-0", "worker-0"]),
    "trainjob": ({"runtime_name": "xgboost-distributed"}, ["node-0", "node-1"]),
}


@pytest.fixture(scope="module")
def xgb_image(node_cluster_for_module) -> str:
    """The example's image, pushed where the node pulls from."""
    return node_cluster_for_module.images.pushed("xgboost")


def _plan(api: str, image: str) -> Callable[[Namespace], Planned]:
    def planned(ns: Namespace) -> Planned:
        settings, _ = APIS[api]
        job = spec(
            ns,
            api,
            image=image,
            command=["python", "/app/train.py"],
            args=["--output-dir", "/tmp/out", "--epochs", "20", "--dataset", "wine"],
            env={"OMP_NUM_THREADS": "1"},
            cpu_request=SHARED_CPU,
            memory_request="1Gi",
            termination_grace_period_seconds=10,
            **settings,
        )
        return Planned(job, {"timeout_s": 400})

    return planned


@pytest.fixture(scope="module")
def xgboost_runs(node_cluster_for_module, xgb_image) -> Iterator[dict[str, NodeRun]]:
    """The XGBoostJob and the TrainJob, started together (node_runs.py)."""
    node_cluster = node_cluster_for_module
    node_cluster.cluster.plane.apply(
        load_documents(TRAINER / "runtimes" / "xgboost_distributed.yaml")
    )
    with started_together(node_cluster, {api: _plan(api, xgb_image) for api in APIS}) as runs:
        yield runs


@pytest.mark.parametrize("api", sorted(APIS))
def test_two_pods_train_xgboost_around_rank_0s_tracker(node_cluster, xgboost_runs, api):
    _, replicas = APIS[api]
    run = xgboost_runs[api]
    result = run.outcome.result(timeout=400)
    log = run.log
    assert result.phase == "Succeeded", f"{result.reason}\n{log[-5000:]}"
    for replica in replicas:  # both joined the tracker: rank + 1 summed over 2 ranks
        assert re.search(rf"\[{replica}\] \[xgb-example\] rank \d/2: .*collective_sum=3\b", log), (
            log[-5000:]
        )
    checksums = set(re.findall(r"\[xgb-example\] rank \d/2: .*model_checksum=(\w+)", log))
    assert len(checksums) == 1, log[-5000:]  # the same trees on both pods
    accuracy = re.search(r"rank 0/2: .*test_accuracy=([0-9.]+)", log)
    assert accuracy and float(accuracy.group(1)) > 0.8, log[-3000:]
    assert refused(run.ns) <= OPTIONAL_READS, refused(run.ns)
    assert calls(run.ns) - OPTIONAL_READS <= granted_permissions()
