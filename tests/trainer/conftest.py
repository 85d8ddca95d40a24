"""Trainer tests run many small CPU trainings side by side with other suites on few cores."""

from __future__ import annotations

import fcntl
import shutil

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import RESUME_ARGS, load_weights, run_operator_style


@pytest.fixture(autouse=True)
def one_cpu_thread(monkeypatch):
    """One compute thread for in-process runs (the trainer keeps OMP_NUM_THREADS when set).

    On a busy 2-core machine two spinning OpenMP threads make a tiny run many times slower.
    """
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def resume_reference(tmp_path_factory, worker_id) -> dict[str, torch.Tensor]:
    """Rank 0's final weights of an uninterrupted 2-rank run of ``RESUME_ARGS`` (images cached in
    memory) on ``write_image_folder``'s data: what the SIGKILL-and-resume tests compare against.

    The run is deterministic, so a session makes it once: xdist workers share it through the
    session's common folder, the first one making it while the others wait on a lock.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base  # gwN's parent: this session's only
    folder = shared / "resume-reference"
    with open(shared / "resume-reference.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / "DONE").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a failed attempt's checkpoints: not resumed
            data = write_image_folder(folder / "data")
            outs = [folder / f"out{r}" for r in range(2)]
            args = [
                [str(a) for a in ["--data-dir", data, "--output-dir", o, *RESUME_ARGS]]
                for o in outs
            ]
            codes, log = run_operator_style(args, log_dir=folder / "logs")
            assert codes == [0, 0], log
            (folder / "DONE").touch()
    return load_weights(folder / "out0" / "model")
