"""The test forkserver's ranks must train as ``python -m trainer.train`` would, whatever the
environment the server itself started with."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import REPO, TINY, base_env

RUN_ONE_RANK = """
import sys
from pathlib import Path
from tests.trainer.trainer_forkserver import ForkedTrainer
from tests.trainer.trainer_launch import REPO, base_env

data, out, log = (Path(a) for a in sys.argv[1:4])
rank_env = base_env()  # OMP_NUM_THREADS=1
args = ["--data-dir", str(data), "--output-dir", str(out), *sys.argv[4:]]
sys.exit(ForkedTrainer(args, env=rank_env, cwd=REPO, log_path=log).wait(timeout=120))
"""


@pytest.mark.slow
def test_a_forked_rank_computes_with_its_own_omp_num_threads(tmp_path):
    """The server imported torch under OMP_NUM_THREADS=3, the rank asks for 1: it gets 1.

    (Run in a fresh interpreter: this worker's server has long been started.)
    """
    data = write_image_folder(tmp_path / "data", per_class=2, val_per_class=1)
    log = tmp_path / "rank0.log"
    args = [*TINY, "--batch-size", "2", "--max-steps", "1"]
    command = [sys.executable, "-c", RUN_ONE_RANK, data, tmp_path / "out", log, *args]
    result = subprocess.run(
        [str(c) for c in command],
        cwd=REPO,
        env=base_env() | {"OMP_NUM_THREADS": "3"},  # what the server starts with
        capture_output=True,
        text=True,
        timeout=180,
    )
    text = log.read_text() if log.exists() else ""
    assert result.returncode == 0, result.stderr + text
    assert "mobilenet_v3_small on cpu (1 thread) x 1" in text, text
