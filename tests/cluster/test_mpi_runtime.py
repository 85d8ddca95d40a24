"""A TrainJob on an MPI runtime (Kubeflow Trainer v2.3's ``deepspeed-distributed``), turned into
pods by the real Trainer controller: sshd node pods and a launcher pod that runs the program, the
SSH key Secret and the hostfile, every pod admitted under ``restricted`` Pod Security; and what
the launcher refuses before submitting."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from components.launcher import SpecError, TrainSpec, build_trainjob
from tests.cluster.control_plane import TRAINER, load_documents
from tests.cluster.play import created_pods
from trainer.distributed import read_hostfile

MPI_PROGRAM = ["python", "-m", "trainer.mpirun", "/app/train.py"]
JOB = "jobset.sigs.k8s.io/replicatedjob-name"


@pytest.fixture
def restricted(cluster, request):
    name = cluster.create_namespace(request.node.name, pod_security="restricted")
    cluster.plane.apply(load_documents(TRAINER / "runtimes" / "deepspeed_distributed.yaml"))
    yield name
    cluster.delete_namespace(name)


def test_an_mpi_trainjob_becomes_sshd_nodes_and_a_launcher_with_the_hostfile(
    cluster, restricted, tmp_path: Path
):
    spec = TrainSpec.flat(
        api="trainjob",
        name="mpi",
        namespace=restricted,
        workers=3,
        nproc_per_node=2,
        run_id="r",
        runtime_name="deepspeed-distributed",
        image="registry.example.com/team/deepspeed:1",
        command=MPI_PROGRAM,
    )
    manifest = build_trainjob(spec)
    patched = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert [job["name"] for job in patched["replicatedJobs"]] == ["node", "launcher"]
    client.CustomObjectsApi(cluster.clients()).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", restricted, "trainjobs", manifest
    )
    # runLauncherAsNode: the launcher is one of the 3 nodes, so 2 sshd node pods come first,
    # each admitted under restricted (sshd runs as UID 1000 on port 2222: nothing more needed)
    nodes = created_pods(cluster, restricted, f"{JOB}=node", 2)
    for pod in nodes:
        (container,) = pod.spec.containers
        assert container.command == ["/usr/sbin/sshd"]  # the runtime's image, not ours
        assert container.security_context.capabilities.drop == ["ALL"]
        assert pod.spec.security_context.run_as_non_root is True
        cluster.kubelet.run(pod)  # Ready: the launcher depends on the nodes being ready
    (launcher,) = created_pods(cluster, restricted, f"{JOB}=launcher", 1)
    (container,) = launcher.spec.containers
    assert container.image == spec.image and container.command == MPI_PROGRAM
    env = {e.name: e.value for e in container.env}
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert container.security_context.allow_privilege_escalation is False  # our patch
    assert launcher.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    core = client.CoreV1Api(cluster.clients())
    secret = core.read_namespaced_secret("mpi-mpi-ssh-auth", restricted)
    assert secret.type == "kubernetes.io/ssh-auth"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(
        core.read_namespaced_config_map("mpi-mpi-hostfile", restricted).data["hostfile"]
    )
    hosts = read_hostfile(str(hostfile))
    # 3 nodes x 2 slots; rank 0 (mpirun places ranks by slot) on the first host: a node pod,
    # which is where trainer.mpirun points every rank's MASTER_ADDR
    assert sum(slots for _, slots in hosts) == spec.world_size == 6
    assert hosts[0] == ("mpi-node-0-0.mpi", 2)
    assert ("mpi-launcher-0-0.mpi", 2) in hosts


def test_our_trainer_on_an_mpi_runtime_is_refused_naming_the_runtime():
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(api="trainjob", name="mpi", runtime_name="deepspeed-distributed")
    assert err.value.field == "runtime_name" and "sshd in the runtime's own image" in str(err.value)
    # a runtime of one's own says it is MPI with ml_policy="mpi"
    with pytest.raises(SpecError, match="MPI runtime"):
        TrainSpec.flat(api="trainjob", name="mpi", runtime_name="my-horovod", ml_policy="mpi")
    TrainSpec.flat(
        api="trainjob", name="mpi", runtime_name="my-horovod", command=MPI_PROGRAM, ml_policy="mpi"
    )
