"""A TrainJob on an MPI runtime, run by the local backend as the runtime runs it: the launcher
replica runs the command with the runtime's hostfile (this machine, every slot), and our trainer
under ``python -m trainer.mpirun`` trains on every rank."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from kfp import dsl

from components.launcher import LocalOptions, TrainSpec, run_job
from components.launcher.backends.local import LocalBackend
from components.launcher.step import TrainingStepInputs, run_training_step
from tests.image_data import write_image_folder

pytestmark = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="no mpirun: Debian's openmpi-bin (.ci/run installs it when root)",
)
MPI_TRAINER = ["python", "-m", "trainer.mpirun", "-m", "trainer.train"]
TINY = ["--model", "mobilenet_v3_small", "--image-size", "16", "--epochs", "1"]


def _spec(tmp_path: Path, **kw) -> TrainSpec:
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    args = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), *TINY]
    base = {
        "api": "trainjob",
        "name": "mpi-local",
        "workers": 2,
        "runtime_name": "deepspeed-distributed",
        "command": MPI_TRAINER,
        "args": [*args, "--batch-size", "2"],
        "env": {"OMP_NUM_THREADS": "1"},
        "image": "registry.example.com/m:1",  # with OpenMPI (the default image is refused)
    }
    return TrainSpec.flat(**(base | kw))


@pytest.mark.slow
def test_the_launcher_replica_runs_our_trainer_on_every_slot(tmp_path: Path):
    lines: list[str] = []
    options = LocalOptions(log=lines.append, workdir=tmp_path, handle_sigterm=False)
    result = run_job(_spec(tmp_path), backend="local", options=options)
    assert result.phase == "Succeeded", "\n".join(lines)
    assert any(line.startswith("[launcher-0] [mpirun] mpirun -np 2 ") for line in lines), lines
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2


def test_a_dry_run_shows_one_launcher_with_the_runtimes_hostfile(tmp_path: Path):
    planned = LocalBackend(LocalOptions(workdir=tmp_path)).dry_run(_spec(tmp_path, workers=3))
    (launcher,) = planned.documents
    assert launcher["replica"] == "launcher-0"
    hostfile = launcher["env"]["OMPI_MCA_orte_default_hostfile"]
    assert hostfile.endswith("mpi-local.hostfile") and "MASTER_PORT" in launcher["env"]
    assert launcher["command"][:4] == [sys.executable, "-m", "trainer.mpirun", "-m"]


def test_our_trainer_on_our_mpi_runtime_needs_no_command(tmp_path: Path):
    """``runtime_name=kfp-ddp-mpi`` and no ``command``: the launcher replica starts our trainer
    under ``trainer.mpirun`` by itself (the KFP step's test below trains so)."""
    spec = _spec(tmp_path, runtime_name="kfp-ddp-mpi", command=None)
    assert spec.container_command() == MPI_TRAINER
    (launcher,) = LocalBackend(LocalOptions(workdir=tmp_path)).dry_run(spec).documents
    assert launcher["replica"] == "launcher-0"
    assert launcher["command"][:5] == [
        sys.executable,
        "-m",
        "trainer.mpirun",
        "-m",
        "trainer.train",
    ]


@pytest.mark.slow
def test_an_mpijob_runs_here_as_its_launcher_does(tmp_path: Path):
    """``api=mpijob`` (the MPI Operator's): one launcher replica with OpenMPI's hostfile
    variable, our trainer under ``trainer.mpirun`` on every slot."""
    spec = _spec(tmp_path, api="mpijob", runtime_name=None, command=None)
    _trains_under_mpirun_with_no_command(spec, tmp_path)


def _trains_under_mpirun_with_no_command(spec: TrainSpec, tmp_path: Path) -> None:
    """The launcher replica starts our trainer under ``trainer.mpirun`` by itself, 2 ranks."""
    assert spec.container_command() == MPI_TRAINER
    lines: list[str] = []
    options = LocalOptions(log=lines.append, workdir=tmp_path, handle_sigterm=False)
    result = run_job(spec, backend="local", options=options)
    assert result.phase == "Succeeded", "\n".join(lines)
    assert any(line.startswith("[launcher-0] [mpirun] mpirun -np 2 ") for line in lines), lines
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2


@pytest.mark.slow
def test_the_kfp_step_trains_on_our_mpi_runtime_and_outputs_the_model(
    tmp_path: Path, capfd, monkeypatch
):
    """The training component's step (``run_training_step``, what KFP calls) with
    ``api=trainjob`` and ``runtime_name=kfp-ddp-mpi`` and no command: our trainer as 2 MPI ranks,
    the model folder and the metrics as the other APIs output them."""
    monkeypatch.chdir(tmp_path)  # the step's local nodes go under its working directory
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "metrics"))
    inputs = TrainingStepInputs(
        api="trainjob",
        image="registry.example.com/team/kfp-ddp:1-mpi",
        workers=2,
        data_dir=str(data),
        output_dir=str(tmp_path / "out"),
        model_name="mobilenet_v3_small",
        image_size=16,
        epochs=1,
        batch_size=2,
        backend="local",
        overrides_json=json.dumps(
            {
                "runtime_name": "kfp-ddp-mpi",
                "env": {"OMP_NUM_THREADS": "1"},
                "backend_options": {"timeout_s": 300},
            }
        ),
    )
    result = run_training_step(inputs, model=model, metrics=metrics)
    output = capfd.readouterr().out
    assert result.phase == "Succeeded" and result.api == "trainjob", output
    assert "[launcher-0] [mpirun] mpirun -np 2 " in output
    assert (Path(model.path) / "weights.pt").is_file()
    assert model.metadata["world_size"] == 2 and metrics.metadata["world_size"] == 2
