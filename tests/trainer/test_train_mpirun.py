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


@pytest.mark.slow
def test_a_rank_that_fails_fails_the_mpi_job(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    args = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), *TINY]
    done = _mpirun(2, [*args, "--batch-size", "64"], MASTER_PORT=str(free_port()))
    assert done.returncode != 0
    assert "--batch-size" in done.stdout + done.stderr


@pytest.mark.slow
def test_the_mpi_launcher_runs_the_trainer_on_every_slot_of_the_hostfile(tmp_path):
    """``python -m trainer.mpirun``, as the launcher of a Trainer MPI runtime runs it: the slots
    of the hostfile (here this machine's, 2), rank 0's address handed to every rank; the two
    ranks read their identity from OpenMPI's variables and train to the end."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    out = tmp_path / "out"
    args = ["--data-dir", str(data), "--output-dir", str(out), *TINY, "--epochs", "2"]
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
    assert "x 2 (mpirun)" in said, said  # two ranks, identity from OpenMPI's variables
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 8  # 16 images / (2 ranks x 2) x 2
    assert (out / "model" / "weights.pt").is_file()


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


def _launch(tmp_path, *argv: str, slots: int = 2) -> subprocess.CompletedProcess:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"localhost slots={slots}\n")
    env = base_env() | {"OMPI_MCA_orte_default_hostfile": str(hostfile)}
    return subprocess.run(
        [sys.executable, "-m", "trainer.mpirun", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_mpi_launcher_runs_a_command_once_on_each_host_before_the_program(tmp_path):
    """``--first-on-each-node``: how the launcher stages the data on every node pod (which run
    sshd alone) before the ranks start; here one host of 2 slots: once, then 2 ranks."""
    marks = tmp_path / "marks"
    first = f"python -c \"open('{marks}', 'a').write('staged\\n'); print('first done')\""
    rank = (
        "import os, pathlib; r = os.environ['OMPI_COMM_WORLD_RANK']; "
        "pathlib.Path(%r, 'rank-' + r).write_text(str(os.path.exists(%r)))"
    )
    done = _launch(
        tmp_path, "--first-on-each-node", first, "-c", rank % (str(tmp_path), str(marks))
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert marks.read_text() == "staged\n"  # once per host, not once per slot
    # both ranks ran, after the first command had
    assert [(tmp_path / f"rank-{r}").read_text() for r in (0, 1)] == ["True", "True"], said


def test_a_failing_first_command_stops_the_mpi_launcher_before_the_program(tmp_path):
    done = _launch(
        tmp_path, "--first-on-each-node", "python -c 'raise SystemExit(3)'", "-c", "print('ran')"
    )
    said = done.stdout + done.stderr
    assert done.returncode == 3, said
    assert "--first-on-each-node failed (exit 3): not training" in said
    assert "ran" not in done.stdout.replace("[mpirun]", "")


def test_once_per_host_places_one_process_on_every_host_of_the_hostfile(tmp_path):
    from trainer.mpirun import mpirun_command

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-node-0-0.job slots=4\njob-launcher-0-0.job slots=4\n")
    environ = {"OMPI_MCA_orte_default_hostfile": str(hostfile), "S3_ENDPOINT_URL": "http://s3"}
    environ["KFP_DDP_CPU_REQUEST"] = "1"  # the launcher pod's, not the workers'
    command = mpirun_command(["python", "-m", "stage"], environ, once_per_host=True)
    assert command[:5] == ["mpirun", "-np", "2", "--map-by", "ppr:1:node"]
    assert command[-3:] == [sys.executable, "-m", "stage"]  # this interpreter, not PATH's
    assert "-x" in command and "S3_ENDPOINT_URL" in command
    assert "KFP_DDP_CPU_REQUEST" not in command
    assert "MASTER_ADDR=job-node-0-0.job" in command
    ranks = mpirun_command(["-m", "trainer.train"], environ)
    assert ranks[:3] == ["mpirun", "-np", "8"]


def test_every_rank_gets_the_node_pods_cpu_request(tmp_path):
    """Ranks started over SSH see nothing of their pod's environment: the node pods' CPU
    request, which the launcher renders, goes to each of them as their own (the launcher pod's
    own request is not forwarded); without it the ranks get none and size by the cores."""
    from trainer.mpirun import mpirun_command

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job slots=1\njob-worker-1.job slots=1\n")
    environ = {"OMPI_MCA_orte_default_hostfile": str(hostfile), "KFP_DDP_CPU_REQUEST": "1"}
    command = mpirun_command(["-m", "trainer.train"], environ | {"KFP_DDP_NODE_CPU_REQUEST": "4"})
    assert command[command.index("KFP_DDP_CPU_REQUEST=4") - 1] == "-x"
    assert not [x for x in command if x.startswith(("KFP_DDP_CPU_REQUEST=1", "KFP_DDP_NODE"))]
    assert not [x for x in mpirun_command(["-m", "x"], environ) if "CPU_REQUEST" in x]


def test_rank_0_is_on_mpiruns_own_machine_when_the_hostfile_lists_it(tmp_path):
    """mpirun fills its own machine's slots first when it is in the hostfile (a launcher that
    is a node too): that is where rank 0 listens, whatever the hostfile's order."""
    import socket

    from trainer.mpirun import mpirun_command

    hostfile = tmp_path / "hostfile"
    own = f"{socket.gethostname().split('.')[0]}.job"
    hostfile.write_text(f"job-node-0-0.job slots=1\n{own} slots=1\n")
    command = mpirun_command(
        ["-m", "trainer.train"], {"OMPI_MCA_orte_default_hostfile": str(hostfile)}
    )
    assert f"MASTER_ADDR={own}" in command
