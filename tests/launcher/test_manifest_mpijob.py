"""The MPIJob of a spec, pure: against the MPI Operator v0.8.0's CRD (strict), its launcher and
workers, and what a spec of ``api="mpijob"`` refuses, naming the setting."""

from __future__ import annotations

import pytest

from components import DEFAULT_IMAGE
from components.launcher import SpecError, TrainSpec, build_manifest
from components.launcher.api_options import MPIJobOptions
from components.launcher.mpijob import SSH_AUTH_MOUNT_PATH, SSHD, build_mpijob
from tests.crds import schema_errors

MPI_IMAGE = f"{DEFAULT_IMAGE}-mpi"


def mpi_spec(**kw) -> TrainSpec:
    base = {
        "api": "mpijob",
        "name": "mpi",
        "namespace": "team",
        "workers": 3,
        "run_id": "r",
        "image": MPI_IMAGE,
    }
    return TrainSpec.flat(**(base | kw))


def _replicas(manifest):
    replicas = manifest["spec"]["mpiReplicaSpecs"]
    return replicas["Launcher"], replicas["Worker"]


def test_our_trainer_as_an_mpijob_is_valid_and_says_everything_the_operator_needs():
    spec = mpi_spec(
        nproc_per_node=2,
        gpus_per_worker=2,
        cpu_request="8",
        memory_request="32Gi",
        stage_data_uri="s3://bucket/data",
        args=["--epochs", "3"],
        active_deadline_seconds=3600,
        env={"NCCL_DEBUG": "INFO"},
    )
    manifest = build_mpijob(spec)
    assert schema_errors("mpijob", manifest) == []
    assert build_manifest(spec) == manifest
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    body = manifest["spec"]
    assert body["slotsPerWorker"] == 2 and body["mpiImplementation"] == "OpenMPI"
    assert body["sshAuthMountPath"] == SSH_AUTH_MOUNT_PATH == "/home/kfp-ddp/.ssh"
    assert body["launcherCreationPolicy"] == "WaitForWorkersReady"  # sshd up before mpirun
    run = body["runPolicy"]
    assert run["backoffLimit"] == 0 and run["activeDeadlineSeconds"] == 3600
    assert run["cleanPodPolicy"] == "Running" and "suspend" not in run
    launcher, worker = _replicas(manifest)
    assert (launcher["replicas"], launcher["restartPolicy"]) == (1, "Never")
    assert (worker["replicas"], worker["restartPolicy"]) == (3, "Never")
    (mpirun,) = launcher["template"]["spec"]["containers"]
    assert mpirun["command"] == ["python", "-m", "trainer.mpirun", "-m", "trainer.train"]
    assert mpirun["args"] == ["--epochs", "3", "--device", "cuda"]  # the ranks' flags
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in mpirun["env"]  # mpirun forwards it
    assert "nvidia.com/gpu" not in str(mpirun["resources"])  # the launcher trains nothing
    assert "initContainers" not in launcher["template"]["spec"]  # nor stages data
    (sshd,) = worker["template"]["spec"]["containers"]
    assert sshd["command"] == list(SSHD) and "args" not in sshd
    # ready once sshd wrote its pid file, asked until then only (no process in the pod after)
    assert sshd["startupProbe"]["exec"]["command"] == ["test", "-s", "/tmp/sshd.pid"]
    assert "readinessProbe" not in sshd and "livenessProbe" not in sshd
    assert sshd["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert sshd["resources"]["requests"]["cpu"] == "8"
    assert worker["template"]["spec"]["initContainers"][0]["name"] == "stage-data"
    for pod in (launcher["template"]["spec"], worker["template"]["spec"]):
        (container,) = pod["containers"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 1000  # sshd's user, the key's owner
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize(
    ("resources", "node_cpus"),
    [({"cpu_request": "1500m"}, "2"), ({"cpu_request": "250m"}, "1"), ({"cpu_limit": "3"}, "3")],
)
def test_the_launcher_tells_mpirun_the_workers_cpu_request(resources, node_cpus):
    """The ranks run on the workers, started over SSH without their pod's environment: the
    launcher's container says the workers' CPU request (whole CPUs, rounded up like the
    Downward API's, a limit standing in for a missing request), which ``trainer.mpirun`` hands
    to every rank (its own request, 500m, is not theirs)."""
    manifest = build_mpijob(mpi_spec(**resources))
    launcher, _ = _replicas(manifest)
    (mpirun,) = launcher["template"]["spec"]["containers"]
    assert {"name": "KFP_DDP_NODE_CPU_REQUEST", "value": node_cpus} in mpirun["env"]
    assert mpirun["resources"]["requests"]["cpu"] == "500m"
    own = build_mpijob(mpi_spec(command=["mpirun", "/app/hvd"], **resources))
    launcher, _ = _replicas(own)
    assert "KFP_DDP_NODE_CPU_REQUEST" not in str(launcher)  # the user's program: not ours to say


def test_the_users_mpi_program_runs_on_the_launcher():
    spec = mpi_spec(
        image="registry.example.com/horovod:1",
        command=["mpirun", "python", "/app/train.py"],
        args=["--lr", "0.1"],
        workers=2,
    )
    manifest = build_mpijob(spec)
    assert schema_errors("mpijob", manifest) == []
    launcher, worker = _replicas(manifest)
    (mpirun,) = launcher["template"]["spec"]["containers"]
    assert mpirun["command"] == ["mpirun", "python", "/app/train.py"]
    assert mpirun["args"] == ["--lr", "0.1"]
    assert mpirun["image"] == "registry.example.com/horovod:1"
    (sshd,) = worker["template"]["spec"]["containers"]
    assert sshd["command"] == list(SSHD)


def test_run_policy_options_and_kueue():
    spec = mpi_spec(
        backoff_limit=2,
        clean_pod_policy="All",
        ttl_seconds_after_finished=60,
        restart_policy="OnFailure",
        scheduler_name="volcano",
        kueue_queue="team-queue",
    )
    assert isinstance(spec.api_options, MPIJobOptions)
    manifest = build_mpijob(spec)
    assert schema_errors("mpijob", manifest) == []
    run = manifest["spec"]["runPolicy"]
    assert (run["backoffLimit"], run["cleanPodPolicy"], run["ttlSecondsAfterFinished"]) == (
        2,
        "All",
        60,
    )
    assert run["schedulingPolicy"]["minAvailable"] == spec.pod_count
    assert run["suspend"] is True
    launcher, _ = _replicas(manifest)
    assert launcher["restartPolicy"] == "OnFailure"


def test_an_mpi_program_of_the_users_says_its_mpi_implementation():
    spec = mpi_spec(
        image="registry.example.com/mpich-app:1",
        command=["mpirun", "/app/solver"],
        mpi_implementation="MPICH",
    )
    manifest = build_mpijob(spec)
    assert schema_errors("mpijob", manifest) == []
    assert manifest["spec"]["mpiImplementation"] == "MPICH"
    assert build_mpijob(mpi_spec())["spec"]["mpiImplementation"] == "OpenMPI"


def test_an_image_whose_sshd_is_set_up_otherwise_says_how():
    """An image of the MPI Operator's examples: its user's ~/.ssh, its sshd's own config."""
    sshd = ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    spec = mpi_spec(
        image="registry.example.com/mpi-pi:openmpi",
        command=["mpirun", "/home/mpiuser/pi"],
        mpi_worker_command=sshd,
        ssh_auth_mount_path="/home/mpiuser/.ssh",
    )
    manifest = build_mpijob(spec)
    assert schema_errors("mpijob", manifest) == []
    assert manifest["spec"]["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    _, worker = _replicas(manifest)
    (container,) = worker["template"]["spec"]["containers"]
    assert container["command"] == sshd
    assert "startupProbe" not in container  # our pid file is not there: ready once it runs


@pytest.mark.parametrize(
    ("settings", "field", "says"),
    [
        ({"image": DEFAULT_IMAGE}, "image", f"{DEFAULT_IMAGE}-mpi"),
        ({"restart_policy": "ExitCode"}, "restart_policy", "Never or OnFailure"),
        ({"mpi_implementation": "Intel"}, "mpi_implementation", "OpenMPI's mpirun"),
        ({"mpi_implementation": "LAM"}, "mpi_implementation", "OpenMPI, Intel, MPICH"),
        ({"mpi_worker_command": []}, "mpi_worker_command", "non-empty list"),
        ({"ssh_auth_mount_path": ".ssh"}, "ssh_auth_mount_path", "absolute path"),
        ({"runtime_name": "kfp-ddp-mpi"}, "runtime_name", "api=trainjob"),
        ({"elastic_min_replicas": 1, "elastic_max_replicas": 2}, "elastic_min_replicas", "fixed"),
        ({"ps_replicas": 1}, "ps_replicas", "api=tfjob"),
        ({"pytorch_master": True}, "pytorch_master", "launcher"),
        ({"env": {"OMPI_MCA_orte_default_hostfile": "/x"}}, "env", "the MPI Operator"),
        ({"name": "a" * 56}, "name", "launcher"),
    ],
)
def test_what_an_mpijob_refuses_names_the_setting(settings, field, says):
    with pytest.raises(SpecError) as refused:
        mpi_spec(**settings)
    assert refused.value.field == field
    assert says in str(refused.value)
