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
OUR_RUNTIME = Path(__file__).parents[2] / "manifests" / "kfp-ddp-mpi-runtime.yaml"


@pytest.fixture
def restricted(cluster, request):
    name = cluster.create_namespace(request.node.name, pod_security="restricted")
    cluster.plane.apply(load_documents(TRAINER / "runtimes" / "deepspeed_distributed.yaml"))
    yield name
    cluster.clear_namespace(name)


RUNTIMES = {
    # Kubeflow Trainer's own MPI runtimes (runLauncherAsNode: true), and a cluster's own as a
    # namespaced TrainingRuntime whose launcher is no node.
    "deepspeed-distributed": ("deepspeed_distributed.yaml", True),
    "mlx-distributed": ("mlx_distributed.yaml", True),
    "launcher-not-a-node": ("deepspeed_distributed.yaml", False),
}


def _install_runtime(cluster, namespace: str, name: str) -> dict:
    """The runtime ``name`` of ``RUNTIMES``: the TrainSpec settings that choose it."""
    file, as_node = RUNTIMES[name]
    (runtime,) = load_documents(TRAINER / "runtimes" / file)
    if as_node:
        cluster.plane.apply([runtime])
        return {"runtime_name": name}
    runtime["kind"] = "TrainingRuntime"
    runtime["metadata"] = {"name": name, "namespace": namespace}
    runtime["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False
    cluster.plane.apply([runtime])
    return {"runtime_name": name, "runtime_kind": "TrainingRuntime", "ml_policy": "mpi"}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_an_mpi_trainjob_becomes_sshd_nodes_and_a_launcher_with_the_hostfile(
    cluster, restricted, tmp_path: Path, runtime
):
    spec = TrainSpec.flat(
        api="trainjob",
        name="mpi",
        namespace=restricted,
        workers=3,
        nproc_per_node=2,
        run_id="r",
        image="registry.example.com/team/deepspeed:1",
        command=MPI_PROGRAM,
        **_install_runtime(cluster, restricted, runtime),
    )
    as_node = RUNTIMES[runtime][1]
    manifest = build_trainjob(spec)
    patched = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert [job["name"] for job in patched["replicatedJobs"]] == ["node", "launcher"]
    client.CustomObjectsApi(cluster.clients()).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", restricted, "trainjobs", manifest
    )
    # runLauncherAsNode: the launcher is one of the 3 nodes, so 2 sshd node pods come first;
    # otherwise 3. Each is admitted under restricted (sshd as UID 1000 on port 2222).
    nodes = created_pods(cluster, restricted, f"{JOB}=node", 2 if as_node else 3)
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
    # 3 nodes x 2 slots: the node pods, and the launcher only when it is a node too
    assert sum(slots for _, slots in hosts) == spec.world_size == 6
    assert hosts[0] == ("mpi-node-0-0.mpi", 2)
    assert (("mpi-launcher-0-0.mpi", 2) in hosts) is as_node


def test_our_trainer_on_trainers_own_mpi_runtimes_is_refused_naming_the_runtime():
    with pytest.raises(SpecError) as err:
        TrainSpec.flat(api="trainjob", name="mpi", runtime_name="deepspeed-distributed")
    assert err.value.field == "runtime_name" and "sshd in the runtime's own image" in str(err.value)
    assert "runtime_name=kfp-ddp-mpi" in str(err.value)  # what to do instead
    # ours, or a runtime of one's own that says it is MPI (pre-flight compares its node image)
    mpi_image = {"image": "registry.example.com/team/kfp-ddp:1-mpi"}  # ours has no OpenMPI
    for settings in ({"runtime_name": "kfp-ddp-mpi"}, {"runtime_name": "mine", "ml_policy": "mpi"}):
        spec = TrainSpec.flat(api="trainjob", name="mpi", **settings, **mpi_image)
        assert spec.container_command() == ["python", "-m", "trainer.mpirun", "-m", "trainer.train"]
    TrainSpec.flat(
        api="trainjob",
        name="mpi",
        runtime_name="my-horovod",
        command=MPI_PROGRAM,
        ml_policy="mpi",
        **mpi_image,
    )


def our_mpi_runtime(image: str) -> dict:
    """manifests/kfp-ddp-mpi-runtime.yaml as an admin installs it: both containers run ``image``."""
    (runtime,) = load_documents(OUR_RUNTIME)
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        for container in job["template"]["spec"]["template"]["spec"]["containers"]:
            container["image"] = image
    return runtime


def test_our_mpi_runtime_runs_our_trainer_from_the_launcher_and_sshd_on_the_nodes(
    cluster, restricted
):
    """manifests/kfp-ddp-mpi-runtime.yaml, applied as shipped (but for the image): the real
    Trainer controller turns our trainer's TrainJob into an sshd node pod and a launcher pod that
    stages the data on every node and runs mpirun, both admitted under restricted."""
    image = "registry.example.com/team/kfp-ddp:1-mpi"
    cluster.plane.apply([our_mpi_runtime(image)])
    spec = TrainSpec.flat(
        api="trainjob",
        name="ours",
        namespace=restricted,
        workers=2,
        run_id="r",
        runtime_name="kfp-ddp-mpi",
        image=image,
        stage_data_uri="s3://bucket/data",
    )
    client.CustomObjectsApi(cluster.clients()).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", restricted, "trainjobs", build_trainjob(spec)
    )
    (node,) = created_pods(cluster, restricted, f"{JOB}=node", 1)
    (container,) = node.spec.containers
    assert container.image == image
    assert container.command == ["/usr/sbin/sshd"]
    assert container.security_context.read_only_root_filesystem is True  # our patch
    mounts = {m.mount_path for m in container.volume_mounts}
    assert {"/home/kfp-ddp/.ssh", "/home/kfp-ddp", "/tmp", "/stage"} <= mounts, mounts
    cluster.kubelet.run(node)
    (launcher,) = created_pods(cluster, restricted, f"{JOB}=launcher", 1)
    (container,) = launcher.spec.containers
    assert container.command[:5] == [
        *("python", "-m", "trainer.mpirun", "--first-on-each-node"),
        "python -m components.s3_sync.stage --source s3://bucket/data --root /stage "
        "--link /stage/current",
    ]
    assert container.command[5:] == ["-m", "trainer.train"]


def test_preflight_refuses_our_trainer_where_the_mpi_nodes_run_another_image():
    from components.launcher.backends.kubernetes.preflight import (
        PreflightError,
        check_policy,
        runtime_node_image,
    )

    runtime = our_mpi_runtime("registry.example.com/team/kfp-ddp:1-mpi")
    assert runtime_node_image(runtime) == "registry.example.com/team/kfp-ddp:1-mpi"
    ours = TrainSpec.flat(
        api="trainjob", name="mpi", runtime_name="kfp-ddp-mpi", image=runtime_node_image(runtime)
    )
    check_policy(ours, "ClusterTrainingRuntime", "kfp-ddp-mpi", runtime)
    other = TrainSpec.flat(api="trainjob", name="mpi", runtime_name="kfp-ddp-mpi", image="other:1")
    with pytest.raises(PreflightError, match="node pods run the image 'registry.example.com"):
        check_policy(other, "ClusterTrainingRuntime", "kfp-ddp-mpi", runtime)


def test_preflight_says_where_an_mpi_runtime_starts_the_ranks_and_in_which_image():
    from components.launcher.backends.kubernetes.preflight import mpi_notes

    (deepspeed,) = load_documents(TRAINER / "runtimes" / "deepspeed_distributed.yaml")
    program = TrainSpec.flat(
        api="trainjob",
        name="mpi",
        runtime_name="deepspeed-distributed",
        command=MPI_PROGRAM,
        image="registry.example.com/team/mine:1",
        nproc_per_node=2,
    )
    first, image = mpi_notes(program, "deepspeed-distributed", deepspeed)
    assert "runLauncherAsNode true" in first and "2 rank(s) per node" in first
    assert "on the launcher pod and the node pods" in first
    assert "'ghcr.io/kubeflow/trainer/deepspeed-runtime'" in image
    assert "your program must be in the node image too" in image
    deepspeed["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False
    (only,) = mpi_notes(
        TrainSpec.flat(
            api="trainjob",
            name="mpi",
            runtime_name="deepspeed-distributed",
            command=MPI_PROGRAM,
            image="ghcr.io/kubeflow/trainer/deepspeed-runtime",
        ),
        "deepspeed-distributed",
        deepspeed,
    )
    assert "on the node pods (not the launcher)" in only
    (torch,) = load_documents(TRAINER / "runtimes" / "torch_distributed.yaml")
    assert mpi_notes(program, "torch-distributed", torch) == []
