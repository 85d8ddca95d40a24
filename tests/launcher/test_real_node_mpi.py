"""Our trainer under mpirun on the real node, as users run it: a TrainJob on our MPI runtime
(``manifests/kfp-ddp-mpi-runtime.yaml``, its image our image's MPI variant pulled from the
loopback registry), the launcher's ServiceAccount with the rendered Role, a namespace enforcing
``restricted``. The Trainer controller makes the SSH key and the hostfile; the node pod runs sshd
as UID 1000; the launcher pod (a node too) stages the data set on both pods over SSH, then runs
our trainer as 2 MPI ranks across the 2 pods, which meet by rank 0's hostname."""

from __future__ import annotations

import pytest

from components.launcher import run_job
from components.launcher.backends.kubernetes import granted_permissions
from tests.cluster.test_mpi_runtime import our_mpi_runtime
from tests.launcher.k8s_helpers import OPTIONAL_READS, calls, options, refused
from tests.launcher.test_real_node_jobs import _summary, dataset, s3_secret, trainer_spec

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.node_image("mpi")]

__all__ = ["dataset"]  # the fixture, shared with the other real-node jobs


@pytest.fixture(scope="module")
def mpi_image_pushed(node_cluster_for_module) -> str:
    return node_cluster_for_module.images.pushed("mpi")


def test_our_trainer_trains_as_mpi_ranks_across_two_pods(
    node_cluster, node_k8s, mpi_image_pushed, dataset
):
    node_cluster.cluster.plane.apply([our_mpi_runtime(mpi_image_pushed)])
    s3_secret(node_k8s, node_cluster.s3)
    job = trainer_spec(
        node_k8s,
        "trainjob",
        node_cluster,
        dataset,
        image=mpi_image_pushed,
        runtime_name="kfp-ddp-mpi",
    )
    lines: list[str] = []
    result = run_job(job, backend="kubernetes", options=options(node_k8s, lines, timeout_s=600))
    log = "\n".join(lines)
    assert result.phase == "Succeeded", f"{result.reason}\n{log[-6000:]}"
    # The data set was staged on both pods (mpirun, one process per host), then 2 ranks trained.
    assert log.count("stage: transferred 36 of 36 files") == 2, log[-6000:]
    # Each rank keeps its threads within its pod's CPU request (500m: 1), passed on by mpirun.
    assert "(1 thread) x 2 (mpirun)" in log, log[-6000:]
    summary = _summary(node_cluster, dataset)
    assert summary["world_size"] == 2 and summary["steps"] > 0
    assert summary["replicas_in_sync"] is True
    assert refused(node_k8s) <= OPTIONAL_READS, refused(node_k8s)
    assert calls(node_k8s) - OPTIONAL_READS <= granted_permissions()


def test_our_trainer_trains_as_an_mpijob_of_the_real_mpi_operator(
    node_cluster, node_k8s, mpi_image_pushed, dataset
):
    """The MPI Operator v0.8.0 makes the SSH key, the hostfile and the workers; each worker
    stages the data set in its init container and runs sshd as UID 1000; once they are ready the
    operator starts the launcher, whose mpirun runs 2 ranks across the 2 workers."""
    s3_secret(node_k8s, node_cluster.s3)
    job = trainer_spec(node_k8s, "mpijob", node_cluster, dataset, image=mpi_image_pushed)
    lines: list[str] = []
    result = run_job(job, backend="kubernetes", options=options(node_k8s, lines, timeout_s=600))
    log = "\n".join(lines)
    assert result.phase == "Succeeded", f"{result.reason}\n{log[-6000:]}"
    # Each rank keeps its threads within its pod's CPU request (500m: 1), passed on by mpirun.
    assert "(1 thread) x 2 (mpirun)" in log, log[-6000:]
    summary = _summary(node_cluster, dataset)
    assert summary["world_size"] == 2 and summary["steps"] > 0
    assert summary["replicas_in_sync"] is True
    assert refused(node_k8s) <= OPTIONAL_READS, refused(node_k8s)
    assert calls(node_k8s) - OPTIONAL_READS <= granted_permissions()
