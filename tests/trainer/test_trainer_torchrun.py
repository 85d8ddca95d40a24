"""``python -m trainer.torchrun`` keeps a SIGTERM retryable (plain torchrun exits 1)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import REPO, TINY, base_env, our_torchrun_command
from trainer import checkpoint as ckpt
from trainer.torchrun import worker_exit_code


def test_worker_exit_code_mapping():
    assert worker_exit_code([0, 0]) == 0
    assert worker_exit_code([143, 143]) == 143
    assert worker_exit_code([143, 2]) == 2  # a permanent error wins
    assert worker_exit_code([0, -9]) == 137  # killed (e.g. OOM): retryable


def test_sigterm_to_torchrun_exits_143_after_a_checkpoint(tmp_path):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "2"]
    args += ["--epochs", "500", "--checkpoint-every-steps", "0"]
    command = our_torchrun_command(args, nproc=2)
    proc = subprocess.Popen(
        command, cwd=REPO, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 90
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "trainer ended early"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0].decode(errors="replace")
    assert proc.returncode == 143, output
    assert len(ckpt.complete_checkpoints(out / "checkpoints")) == 1, output
    assert output.count("SIGTERM received") == 2  # torchrun forwarded it to both workers


@pytest.mark.slow
def test_a_lost_rendezvous_store_is_retryable_not_permanent(tmp_path):
    """A node whose c10d store is gone (the host of a Workers-only PyTorchJob's rendezvous was
    killed): plain torchrun raises and exits 1, which the operator's ExitCode policy would treat
    as permanent; the wrapper exits 200 (a lost peer), saying so."""
    from tests.trainer.trainer_launch import free_port

    with socket.socket() as placeholder:  # a port where no store answers
        placeholder.bind(("127.0.0.1", free_port()))
        port = placeholder.getsockname()[1]
    command = [sys.executable, "-m", "trainer.torchrun", "--nnodes", "2", "--nproc-per-node", "1"]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    command += ["--rdzv-conf", "is_host=false,timeout=5,read_timeout=5,join_timeout=5"]
    command += ["-m", "trainer.train", "--help"]
    done = subprocess.run(
        command, cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 200, done.stderr[-2000:]
    assert "lost the rendezvous with the other nodes (RendezvousConnectionError" in done.stderr
    assert done.stderr.rstrip().endswith("resumes from its last checkpoint")
