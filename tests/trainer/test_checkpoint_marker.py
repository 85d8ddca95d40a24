"""The COMPLETE marker vouches for state.pt's bytes (size and sha256 recorded as it is written)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from trainer import checkpoint as ckpt


def _state(step: int) -> dict:
    return {
        "format_version": ckpt.FORMAT_VERSION,
        "step": step,
        "epoch": 0,
        "batch_in_epoch": step,
        "model": {"weight": torch.arange(100_000, dtype=torch.float32) * step},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "scaler": {},
        "rng": {"seed": 0},
        "config": {"model": "test"},
    }


def test_the_marker_records_the_size_and_sha256_of_the_state_written(tmp_path):
    folder = ckpt.save_checkpoint(tmp_path, 3, _state(3), keep=2)
    data = (folder / ckpt.STATE_FILE).read_bytes()
    marker = json.loads((folder / ckpt.MARKER_FILE).read_text())
    assert marker["state_bytes"] == len(data)
    assert marker["state_sha256"] == hashlib.sha256(data).hexdigest()
    assert ckpt.read_checkpoint_bytes(folder) == data


def test_a_flipped_byte_that_torch_load_accepts_is_caught_and_set_aside(tmp_path, capsys):
    ckpt.save_checkpoint(tmp_path, 3, _state(3), keep=2)
    newest = ckpt.save_checkpoint(tmp_path, 6, _state(6), keep=2)
    path = newest / ckpt.STATE_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor bytes
    path.write_bytes(bytes(data))
    ckpt.decode_checkpoint(bytes(data))  # torch.load itself does not notice

    with pytest.raises(ckpt.CheckpointError, match="sha256 differs"):
        ckpt.read_checkpoint_bytes(newest)
    found = ckpt.newest_loadable_checkpoint(tmp_path)
    assert found is not None and found[0].name == "step-3"
    assert (tmp_path / "step-6.corrupt").is_dir()
    assert "step-6 is unusable" in capsys.readouterr().err


def test_a_truncated_state_is_named_as_such(tmp_path):
    folder = ckpt.save_checkpoint(tmp_path, 3, _state(3), keep=2)
    path = folder / ckpt.STATE_FILE
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ckpt.CheckpointError, match="bytes, but .* were written"):
        ckpt.read_checkpoint_bytes(folder)


def test_a_marker_of_an_older_version_without_hash_still_loads(tmp_path):
    folder = ckpt.save_checkpoint(tmp_path, 3, _state(3), keep=2)
    marker = {"format_version": ckpt.FORMAT_VERSION, "step": 3, "saved_at": 0.0}
    (folder / ckpt.MARKER_FILE).write_text(json.dumps(marker))
    state = ckpt.decode_checkpoint(ckpt.read_checkpoint_bytes(folder))
    assert state["step"] == 3
