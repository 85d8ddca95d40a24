"""The uploader thread on its own: falling behind, failing, retrying (real S3: SeaweedFS)."""

from __future__ import annotations

import os
import threading

import torch

from tests.trainer.s3_mirror_helpers import complete_remote_steps, remote_steps
from tests.trainer.trainer_launch import free_port
from trainer import checkpoint as ckpt
from trainer.remote_checkpoints import RemoteCheckpoints, is_transient
from trainer.run_log import RunLog
from trainer.s3_mirror import CheckpointMirror


def _checkpoint(root, step: int, floats: int = 1000):
    state = {
        "format_version": ckpt.FORMAT_VERSION,
        "step": step,
        "epoch": 0,
        "batch_in_epoch": step,
        "model": {"weight": torch.full((floats,), float(step))},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "scaler": {},
        "rng": {"seed": 0},
        "config": {},
    }
    return ckpt.save_checkpoint(root, step, state, keep=100)


def _mirror(root, uri, keep=2) -> CheckpointMirror:
    remote = RemoteCheckpoints(uri, root, patience_s=5)
    remote.list_complete()
    return CheckpointMirror(remote, keep=keep, log=RunLog(root, is_main=True))


def test_when_uploads_fall_behind_the_newest_checkpoint_replaces_the_waiting_one(
    tmp_path, s3_env, bucket, capsys
):
    root = tmp_path / "ckpt"
    folders = [_checkpoint(root, step, floats=4_000_000) for step in (1, 2, 3, 4)]  # 16 MB each
    mirror = _mirror(root, f"s3://{bucket}/run")
    for step, folder in enumerate(folders, start=1):
        mirror.offer(step, folder)  # as fast as a writer could: never waits for an upload
    assert mirror.wait_durable(4, folders[-1], timeout_s=60) is None
    mirror.close(timeout_s=60)
    assert mirror.skipped, "four offers within microseconds, yet nothing was skipped"
    assert 4 not in mirror.skipped and [m.step for m in mirror.mirrored][-1] == 4
    assert set(mirror.skipped).isdisjoint(m.step for m in mirror.mirrored)
    assert "are behind: step-" in capsys.readouterr().out
    steps = remote_steps(s3_env.client(), bucket, "run")  # keep=2: at most two, all complete
    assert max(steps) == 4 and len(steps) <= 2
    assert all(names == {"state.pt", "COMPLETE"} for names in steps.values())
    assert not (root / ".mirror" / "uploading").exists()  # no links left holding disk space


def test_a_failed_upload_is_logged_and_the_next_checkpoint_uploaded(
    tmp_path, s3_env, bucket, capsys
):
    root = tmp_path / "ckpt"
    client = s3_env.client()
    mirror = _mirror(root, f"s3://{bucket}/run")
    client.delete_bucket(Bucket=bucket)  # S3 refuses every request for a while

    first = _checkpoint(root, 1)
    mirror.offer(1, first)
    error = mirror.wait_durable(1, first, timeout_s=30)
    assert error is not None and not is_transient(error)  # a refusal: not retried
    out = capsys.readouterr().out
    assert "WARNING: the upload of step-1" in out and "does not exist" in out
    assert "S3 still holds no complete checkpoint" in out and "retrying" not in out

    client.create_bucket(Bucket=bucket)
    second = _checkpoint(root, 2)
    mirror.offer(2, second)
    assert mirror.wait_durable(2, second, timeout_s=30) is None
    mirror.close(timeout_s=30)
    assert complete_remote_steps(client, bucket, "run") == [2]
    assert remote_steps(client, bucket, "run") == {2: {"state.pt", "COMPLETE"}}


def test_an_outage_shorter_than_the_timeout_is_ridden_out(
    tmp_path, s3_env, bucket, capsys, monkeypatch
):
    root = tmp_path / "ckpt"
    mirror = _mirror(root, f"s3://{bucket}/run")
    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")  # S3 is down
    back = threading.Timer(2.5, lambda: os.environ.update(AWS_ENDPOINT_URL_S3=endpoint))
    back.start()
    try:
        folder = _checkpoint(root, 5)
        assert mirror.wait_durable(5, folder, timeout_s=40) is None
    finally:
        back.cancel()
        mirror.close(timeout_s=30)
    out = capsys.readouterr().out
    assert "cannot reach the S3 endpoint" in out and "retrying the upload of step-5" in out
    assert complete_remote_steps(s3_env.client(), bucket, "run") == [5]


def test_a_dead_endpoint_ends_the_wait_with_the_last_error(tmp_path, s3_env, bucket, monkeypatch):
    root = tmp_path / "ckpt"
    mirror = _mirror(root, f"s3://{bucket}/run")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    folder = _checkpoint(root, 7)
    error = mirror.wait_durable(7, folder, timeout_s=4)
    mirror.close(timeout_s=30)
    assert error is not None and is_transient(error)
    assert "cannot reach the S3 endpoint" in str(error)
