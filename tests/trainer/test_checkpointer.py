"""The background checkpoint writer: snapshots at save time, one write in flight, failures kept.

The disk-full tests fill a real (small) tmpfs; nothing fakes an errno.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import REPO, TINY, base_env, our_torchrun_command
from trainer import checkpoint as ckpt
from trainer.checkpointer import Checkpointer
from trainer.errors import EXIT_STORAGE, StorageError
from trainer.run_log import RunLog
from trainer.train import main

MIB = 2**20


def _state(step: int, weights: torch.Tensor) -> dict:
    """A minimal state that passes the checkpoint format's checks."""
    return {
        "format_version": ckpt.FORMAT_VERSION,
        "step": step,
        "epoch": 0,
        "batch_in_epoch": step,
        "model": {"weight": weights},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "scaler": {},
        "rng": {"seed": 0},
        "config": {"model": "test"},
        "history": {"train_loss": 1.0},
    }


def _checkpointer(root, keep=2, background=True) -> Checkpointer:
    return Checkpointer(
        root, keep=keep, is_writer=True, log=RunLog(root, is_main=True), background=background
    )


def test_the_snapshot_is_taken_when_save_returns(tmp_path):
    weights = torch.arange(1_000_000, dtype=torch.float32)
    history = {"train_loss": 1.0}
    writer = _checkpointer(tmp_path / "ckpt")
    writer.save(1, lambda: _state(1, weights) | {"history": history}, "periodic")
    # Training goes on at once and changes the live tensors and dicts in place.
    weights.add_(1.0)
    history["train_loss"] = 99.0
    writer.close()
    state = ckpt.decode_checkpoint(ckpt.read_checkpoint_bytes(tmp_path / "ckpt" / "step-1"))
    assert torch.equal(state["model"]["weight"], torch.arange(1_000_000, dtype=torch.float32))
    assert state["history"] == {"train_loss": 1.0}


def test_a_save_waits_for_the_write_in_flight_and_pruning_follows_writes(tmp_path):
    root = tmp_path / "ckpt"
    writer = _checkpointer(root, keep=2)
    weights = torch.zeros(2_000_000)
    for step in (1, 2, 3):
        writer.save(step, lambda step=step: _state(step, weights + step), "periodic")
        # Returning from save(step) means the previous write completed (one in flight at most).
        if step > 1:
            assert ckpt.is_complete(root / f"step-{step - 1}")
    writer.wait()
    assert [p.name for p in ckpt.complete_checkpoints(root)] == ["step-3", "step-2"]
    assert not writer.failed()
    writer.close()


def test_a_full_disk_keeps_the_last_checkpoint_and_names_folder_sizes_and_fix(small_disk):
    root = small_disk(6 * MIB)
    writer = _checkpointer(root, keep=2)
    weights = torch.ones(1_000_000)  # 3.8 MiB: one checkpoint fits, two do not
    writer.save(1, lambda: _state(1, weights), "periodic")
    writer.save(2, lambda: _state(2, weights * 2), "periodic")
    writer.wait()
    assert writer.failed()
    message = str(writer.failure)
    assert isinstance(writer.failure, StorageError) and writer.failure.exit_code == EXIT_STORAGE
    assert f"checkpoint step-2 could not be written to {root}: no space left" in message
    assert "3.8 MiB needed" in message and "MiB free" in message
    assert "step-1, is intact" in message and "larger volume" in message
    # The complete checkpoint survives; the half-written one is gone (its space given back).
    assert [p.name for p in ckpt.complete_checkpoints(root)] == ["step-1"]
    assert sorted(p.name for p in root.iterdir()) == ["step-1"]
    assert sorted(p.name for p in (root / "step-1").iterdir()) == [ckpt.MARKER_FILE, "state.pt"]
    # Nothing more is written after a failure; the failure stays reported.
    writer.save(3, lambda: _state(3, weights), "periodic")
    writer.close()
    assert not (root / "step-3").exists() and writer.failed()


def _state_pt_bytes(tmp_path) -> int:
    """The size of the TINY model's checkpoint (measured, so the disk can be sized to it)."""
    data = write_image_folder(tmp_path / "measure-data")
    out = tmp_path / "measure"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4", "--max-steps", "1"]
    assert main([str(a) for a in args]) == 0
    return (out / "checkpoints" / "step-1" / ckpt.STATE_FILE).stat().st_size


def test_disk_full_in_one_process_exits_4_with_the_cause_as_last_line(tmp_path, small_disk, capsys):
    size = _state_pt_bytes(tmp_path)
    disk = small_disk(int(size * 1.6))  # room for one checkpoint, not for the next one
    data = write_image_folder(tmp_path / "data")
    args = ["--data-dir", data, "--output-dir", tmp_path / "out", "--checkpoint-dir", disk]
    args += [*TINY, "--batch-size", "4", "--max-steps", "6", "--checkpoint-every-steps", "2"]
    args += ["--keep-checkpoints", "1", "--stop-check-every-steps", "1"]
    capsys.readouterr()
    assert main([str(a) for a in args]) == EXIT_STORAGE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("[trainer] error: checkpoint step-4 could not be written to")
    assert "no space left" in last and "needed" in last and "free" in last
    assert "--checkpoint-dir a larger volume" in last
    assert [p.name for p in ckpt.complete_checkpoints(disk)] == ["step-2"]
    assert not (tmp_path / "out" / "model").exists()


@pytest.mark.slow
def test_disk_full_under_torchrun_exits_4_and_the_pod_log_ends_with_the_cause(tmp_path, small_disk):
    size = _state_pt_bytes(tmp_path)
    disk = small_disk(int(size * 1.6))
    data = write_image_folder(tmp_path / "data")
    args = ["--data-dir", data, "--output-dir", tmp_path / "out", "--checkpoint-dir", disk]
    args += [*TINY, "--batch-size", "2", "--max-steps", "8", "--checkpoint-every-steps", "2"]
    args += ["--keep-checkpoints", "1"]
    command = our_torchrun_command(args, nproc=2)
    result = subprocess.run(
        command,
        cwd=REPO,
        env=base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
    )
    output = result.stdout
    assert result.returncode == EXIT_STORAGE, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("[trainer] error (rank 0, exit 4): checkpoint step-4 could not be"), (
        output
    )
    assert str(disk) in last and "needed" in last and "free" in last and "Fix:" in last
    assert "Traceback" not in output
    assert [p.name for p in ckpt.complete_checkpoints(disk)] == ["step-2"]
    state = torch.load(disk / "step-2" / ckpt.STATE_FILE, map_location="cpu", weights_only=True)
    assert state["step"] == 2
    assert not (tmp_path / "out" / "summary.json").exists()
    assert json.loads((disk / "step-2" / ckpt.MARKER_FILE).read_text())["step"] == 2


def test_the_blocking_writer_has_written_when_save_returns(tmp_path):
    """The writer the trainer had before (kept for benchmarks/checkpoint_stall.py)."""
    root = tmp_path / "ckpt"
    writer = _checkpointer(root, keep=1, background=False)
    writer.save(1, lambda: _state(1, torch.ones(10)), "periodic")
    assert ckpt.is_complete(root / "step-1") and not writer.failed()
    writer.save(2, lambda: _state(2, torch.ones(10)), "periodic")
    assert [p.name for p in ckpt.complete_checkpoints(root)] == ["step-2"]
    writer.close()
