"""Networking knobs of the trainer: gradient compression, and the collective timeout."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import TINY, logs, run_operator_style, start_operator_style
from trainer.train import lost_peer


def test_fp16_gradient_compression_trains_in_sync(tmp_path):
    """The DDP comm hook halves the all-reduced bytes; replicas still end bit-identical."""
    data = write_image_folder(tmp_path / "data")
    outs = [tmp_path / f"out{r}" for r in range(2)]
    common = [*TINY, "--batch-size", "4", "--max-steps", "4", "--grad-compression", "fp16"]
    args = [[str(a) for a in ["--data-dir", data, "--output-dir", o, *common]] for o in outs]
    codes, log = run_operator_style(args, log_dir=tmp_path / "logs")
    assert codes == [0, 0], log
    summary = json.loads((outs[0] / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["replicas_in_sync"] is True
    state_config = summary  # the flag is part of the run's settings (resumes check it)
    assert state_config["world_size"] == 2


def test_a_stalled_peer_fails_the_job_after_the_collective_timeout(tmp_path):
    """Not after the (long) start-up timeout: that one only covers joining the job."""
    data = write_image_folder(tmp_path / "data")
    outs = [tmp_path / f"out{r}" for r in range(2)]
    common = [*TINY, "--batch-size", "2", "--epochs", "200", "--checkpoint-every-steps", "0"]
    common += ["--init-timeout-s", "300", "--collective-timeout-s", "3"]
    args = [[str(a) for a in ["--data-dir", data, "--output-dir", o, *common]] for o in outs]
    procs = start_operator_style(args, log_dir=tmp_path / "logs")
    metrics = outs[0] / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 90
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert procs[0].poll() is None and time.monotonic() < deadline, logs(tmp_path / "logs")
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGSTOP)  # a peer that hangs (a frozen node), not one that dies
        code = procs[0].wait(timeout=60)  # far less than --init-timeout-s 300
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    log = logs(tmp_path / "logs")
    assert code == 200, log  # retryable: a restart of the job resumes from its checkpoint
    assert "timed out" in log.lower() or "timeout" in log.lower(), log
    assert "lost contact with another rank" in log, log


def test_a_dead_peer_makes_the_survivor_exit_retryable(tmp_path):
    """A node that dies (preemption) must not make its peers look like a permanent failure (exit
    1-127 would stop the Training Operator's ExitCode policy from restarting the job)."""
    data = write_image_folder(tmp_path / "data")
    outs = [tmp_path / f"out{r}" for r in range(2)]
    common = [*TINY, "--batch-size", "2", "--epochs", "200", "--checkpoint-every-steps", "0"]
    common += ["--collective-timeout-s", "30"]
    args = [[str(a) for a in ["--data-dir", data, "--output-dir", o, *common]] for o in outs]
    procs = start_operator_style(args, log_dir=tmp_path / "logs")
    metrics = outs[0] / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 90
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert procs[0].poll() is None and time.monotonic() < deadline, logs(tmp_path / "logs")
            time.sleep(0.05)
        procs[1].kill()
        code = procs[0].wait(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    log = logs(tmp_path / "logs")
    assert code == 200, log
    assert "lost contact with another rank" in log, log


@pytest.mark.parametrize(
    "message",
    [
        # seen in CI: DDP's buffer broadcast found the pair closed by another op's timeout
        "Application timeout caused pair closure",
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
        "Timed out waiting 3000ms for recv operation to complete",
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
        "[10.0.0.7]:41234: Connection reset by peer",
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer",
    ],
)
def test_gloo_messages_of_a_lost_peer_are_retryable(message):
    assert lost_peer(RuntimeError(message))


@pytest.mark.parametrize(
    "message",
    [
        "mat1 and mat2 shapes cannot be multiplied (4x576 and 1024x3)",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "Timeout reading the data folder",  # a timeout, but not of the job's transport
    ],
)
def test_other_runtime_errors_are_not_a_lost_peer(message):
    assert not lost_peer(RuntimeError(message))
