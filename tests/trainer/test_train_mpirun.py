"""Our trainer under OpenMPI's mpirun (as Kubeflow Trainer's MPI runtimes start it): two ranks
read their identity from OMPI_COMM_WORLD_* and train with gloo to the end, as under torchrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import REPO, TINY, base_env, free_port

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(
    MPIRUN is None, reason="no mpirun: Debian's openmpi-bin (.ci/run installs it when root)"
)


def _mpirun(np: int, args: list[str], **extra_env: str) -> subprocess.CompletedProcess:
    command = [str(MPIRUN), "-np", str(np), "--bind-to", "none", "--oversubscribe"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    for name, value in extra_env.items():
        command += ["-x", f"{name}={value}"]
    for name in ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "PYTHONUNBUFFERED", "PATH"):
        command += ["-x", name]
    command += [sys.executable, "-m", "trainer.train", *args]
    return subprocess.run(
        command, cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=180
    )


def test_two_mpi_ranks_train_to_the_end(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    out = tmp_path / "out"
    args = ["--data-dir", str(data), "--output-dir", str(out), *TINY, "--epochs", "2"]
    done = _mpirun(2, [*args, "--batch-size", "2"], MASTER_PORT=str(free_port()))
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "x 2 (mpirun)" in said, said  # two ranks, identity from OpenMPI's variables
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 8  # 16 images / (2 ranks x 2) x 2
    assert (out / "model" / "weights.pt").is_file()


def test_a_rank_that_fails_fails_the_mpi_job(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    args = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), *TINY]
    done = _mpirun(2, [*args, "--batch-size", "64"], MASTER_PORT=str(free_port()))
    assert done.returncode != 0
    assert "--batch-size" in done.stdout + done.stderr


def test_the_mpi_launcher_runs_the_trainer_on_every_slot_of_the_hostfile(tmp_path):
    """``python -m trainer.mpirun``, as the launcher of a Trainer MPI runtime runs it: the slots
    of the hostfile (here this machine's, 2), rank 0's address handed to every rank."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    out = tmp_path / "out"
    args = ["--data-dir", str(data), "--output-dir", str(out), *TINY, "--epochs", "1"]
    env = base_env() | {
        "OMPI_MCA_orte_default_hostfile": str(hostfile),
        "MASTER_PORT": str(free_port()),
        "S3_LIKE_SETTING": "forwarded",
    }
    done = subprocess.run(
        [sys.executable, "-m", "trainer.mpirun", "-m", "trainer.train", *args, "--batch-size", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "[mpirun] mpirun -np 2 " in said and "-x MASTER_ADDR=localhost" in said, said
    assert "-x S3_LIKE_SETTING" in said and "-x HOSTNAME" not in said, said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2


def test_the_mpi_launcher_without_a_hostfile_says_where_it_runs(tmp_path):
    env = {k: v for k, v in base_env().items() if k != "OMPI_MCA_orte_default_hostfile"}
    done = subprocess.run(
        [sys.executable, "-m", "trainer.mpirun", "-m", "trainer.train"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "OMPI_MCA_orte_default_hostfile is not set" in done.stderr
