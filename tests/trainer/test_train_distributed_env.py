"""Distributed identity from torchrun's, the Training Operator's, OpenMPI's or no environment."""

from __future__ import annotations

import pytest

from trainer.cpu_request import CPU_REQUEST_ENV
from trainer.distributed import DistEnv, dist_env_from
from trainer.errors import ConfigError

MASTER = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}


def test_no_env_is_one_process():
    assert dist_env_from({}) == DistEnv()
    assert not dist_env_from({}).distributed


def test_torchrun():
    env = dist_env_from(
        MASTER
        | {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
        | {"PET_NPROC_PER_NODE": "4", "TORCHELASTIC_RUN_ID": "x"}
    )
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (5, 1, 8, 4)
    assert env.launcher == "torchrun" and env.master_addr == "job-master-0"
    assert env.master_port == 23456 and not env.is_main


def test_operator_pod_running_the_trainer_directly():
    env = dist_env_from(
        MASTER
        | {"RANK": "2", "WORLD_SIZE": "3", "PET_NNODES": "3", "PET_NODE_RANK": "2"}
        | {"PET_NPROC_PER_NODE": "1"}
    )
    assert (env.rank, env.local_rank, env.world_size, env.launcher) == (2, 0, 3, "operator")


def test_only_pet_variables():
    env = dist_env_from(
        {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "9"}
    )
    assert (env.rank, env.world_size, env.master_addr, env.master_port) == (1, 2, "m", 9)


def _ompi(rank: int, world: int, local_rank: int, local_world: int) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_world),
    }


def test_mpirun_on_one_machine_meets_here():
    env = dist_env_from(_ompi(1, 2, 1, 2))
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (1, 1, 2, 2)
    assert (env.master_addr, env.master_port, env.launcher) == ("127.0.0.1", 29500, "mpirun")


def test_mpirun_across_machines_meets_at_the_hostfiles_first_host(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(
        "# written by the Trainer\n\njob-launcher-0-0.job slots=2\njob-node-0-0.job slots=2\n"
    )
    environ = _ompi(3, 4, 1, 2) | {"OMPI_MCA_orte_default_hostfile": str(hostfile)}
    env = dist_env_from(environ)
    assert (env.rank, env.local_rank, env.world_size) == (3, 1, 4)
    assert env.master_addr == "job-launcher-0-0.job"
    # MASTER_ADDR and MASTER_PORT, when given (mpirun -x), win
    given = dist_env_from(environ | MASTER)
    assert (given.master_addr, given.master_port) == ("job-master-0", 23456)


def test_mpirun_across_machines_without_an_address_says_how_to_give_one(tmp_path):
    with pytest.raises(ConfigError, match="set MASTER_ADDR"):
        dist_env_from(_ompi(0, 4, 0, 2))
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="names no host"):
        dist_env_from(_ompi(0, 4, 0, 2) | {"OMPI_MCA_orte_default_hostfile": str(empty)})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (MASTER | {"RANK": "0", "WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "2"}, "torchrun"),
        (_ompi(2, 2, 0, 1), "start the trainer with mpirun"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR/MASTER_PORT are not set"),
        (MASTER | {"RANK": "2", "WORLD_SIZE": "2"}, "0 <= RANK < WORLD_SIZE"),
        (MASTER | {"RANK": "zero", "WORLD_SIZE": "2"}, "RANK='zero' is not an integer"),
    ],
)
def test_inconsistent_env_is_a_config_error(environ, message):
    with pytest.raises(ConfigError, match=message):
        dist_env_from(environ)


def test_cpu_threads_are_shared_by_the_processes_of_one_machine():
    from trainer.distributed import available_cpus, processes_on_this_machine

    local = dist_env_from(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    )
    assert processes_on_this_machine(local) == 2  # operator-style "pods" on one machine
    remote = dist_env_from(MASTER | {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert processes_on_this_machine(remote) == 1
    assert available_cpus() >= 1


@pytest.mark.parametrize(
    ("request_env", "threads"),
    [({}, 4), ({"KFP_DDP_CPU_REQUEST": "2"}, 1), ({"KFP_DDP_CPU_REQUEST": "64"}, 4)]
    + [({"KFP_DDP_CPU_REQUEST": bad}, 4) for bad in ("0", "", "1.5", "two")],
)
def test_compute_threads_stay_within_the_pods_cpu_request(monkeypatch, request_env, threads):
    """8 cores seen, 2 processes on the machine: 4 threads each, unless the pod's request (the
    Downward API's whole CPUs) is smaller; a value that is not a positive whole number is not
    a request."""
    import torch

    import trainer.distributed as distributed

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(CPU_REQUEST_ENV, raising=False)
    for name, value in request_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(distributed, "available_cpus", lambda: 8)
    before = torch.get_num_threads()
    try:
        env = dist_env_from(MASTER | {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
        assert distributed.configure_cpu_threads(env) == threads
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_wins_over_the_cpu_request(monkeypatch):
    import torch

    import trainer.distributed as distributed

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv(CPU_REQUEST_ENV, "1")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # what OMP_NUM_THREADS=3 gives a fresh process
        assert distributed.configure_cpu_threads(dist_env_from(MASTER | {"RANK": "0"})) == 3
    finally:
        torch.set_num_threads(before)


def test_trainer_imports_no_pipeline_or_cloud_packages():
    import subprocess
    import sys

    code = (
        "import sys, trainer.train, trainer.export, trainer.torchrun, trainer.data\n"
        "bad = [m for m in ('kfp', 'boto3', 'botocore', 'kubernetes', 'kubeflow', 'components',"
        " 'pipelines') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
