"""--checkpoint-uri: checkpoints mirrored to a real S3 server (SeaweedFS), resumed from it.

Every run here is a real trainer (in this process, or real processes where a signal or a second
node is needed); S3 is only ever changed by the test where the test says so.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.s3_mirror_helpers import (
    complete_remote_steps,
    keys,
    remote_steps,
    wait_for_line,
)
from tests.trainer.trainer_forkserver import ForkedTrainer
from tests.trainer.trainer_launch import (
    REPO,
    RESUME_ARGS,
    TINY,
    base_env,
    files_under,
    free_port,
    load_weights,
    logs,
    run_operator_style,
    start_operator_style,
    wait_all,
)
from trainer import checkpoint as ckpt
from trainer.errors import EXIT_CONFIG, EXIT_SIGTERM, EXIT_STORAGE
from trainer.train import main

# One process: 36 images, batch 4 -> 9 steps per epoch; checkpoints every 3 steps.
ONE = [*TINY, "--batch-size", "4", "--checkpoint-every-steps", "3", "--keep-checkpoints", "2"]
# Uploads here often take longer than 3 tiny steps: a checkpoint may be skipped while another
# uploads (by design), so which older steps S3 keeps varies; the last one is always there.


def assert_mirrored(client, bucket, prefix, *, last: int, keep: int, every: int) -> list[int]:
    """S3 holds ``keep`` complete checkpoints, the newest ``last``, and nothing else."""
    steps = remote_steps(client, bucket, prefix)
    assert all(names == {"state.pt", "COMPLETE"} for names in steps.values()), steps
    newest = sorted(steps, reverse=True)
    assert newest[0] == last and len(newest) == keep, steps
    assert all(step % every == 0 for step in newest), steps
    return newest


def _run(data, out, uri, *extra) -> int:
    args = ["--data-dir", data, "--output-dir", out, *ONE, "--checkpoint-uri", uri, *extra]
    return main([str(a) for a in args])


# --------------------------------------------------------------------------------- the flag
@pytest.mark.parametrize(
    "uri",
    [
        "gs://bucket/prefix",
        "bucket/prefix",
        "s3://",
        "s3://UPPER/prefix",
        "s3://ab/prefix",
        "s3://bucket//twice",
        "s3://bucket/a/../b",
    ],
)
def test_a_bad_uri_exits_2_naming_the_flag(tmp_path, capsys, uri):
    code = main(["--synthetic", "--output-dir", str(tmp_path / "out"), "--checkpoint-uri", uri])
    assert code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"--checkpoint-uri {uri!r} is not usable" in err and "s3://bucket/prefix" in err
    assert not (tmp_path / "out").exists()


def test_the_upload_wait_must_end_before_the_collectives_time_out(tmp_path, capsys):
    args = ["--synthetic", "--output-dir", str(tmp_path), "--checkpoint-uri", "s3://bucket/x"]
    args += ["--checkpoint-upload-timeout-s", "700"]
    assert main(args) == EXIT_CONFIG
    assert "--checkpoint-upload-timeout-s 700 must be below --collective-timeout-s 600" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_without_the_flag_the_trainer_needs_no_s3_package(tmp_path):
    """boto3, botocore, awscrt and our components cannot even be imported, and a run works."""
    data = write_image_folder(tmp_path / "data")
    code = f"""
import importlib.abc, sys
BLOCKED = ("boto3", "botocore", "awscrt", "s3transfer", "components")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked by the test: " + name)
sys.meta_path.insert(0, Block())
from trainer.train import main
code = main(["--data-dir", {str(data)!r}, "--output-dir", {str(tmp_path / "out")!r},
             *{TINY!r}, "--batch-size", "4", "--max-steps", "3", "--checkpoint-every-steps", "2"])
loaded = [m for m in sys.modules if m.split(".")[0] in BLOCKED]
print("RESULT", code, loaded)
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "RESULT 0 []" in result.stdout, result.stdout + result.stderr
    assert ckpt.latest_complete_checkpoint(tmp_path / "out" / "checkpoints") is not None


# ------------------------------------------------------------------------------ start-up
def test_a_missing_bucket_exits_2_before_training(tmp_path, s3_env, capsys):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    assert _run(data, out, "s3://no-such-bucket-here/run") == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--checkpoint-uri s3://no-such-bucket-here/run" in err
    assert "S3 refused" in err and "does not exist" in err
    assert not (out / "metrics.jsonl").exists()  # no step was trained
    assert ckpt.step_dirs(out / "checkpoints") == []


def test_rejected_credentials_exit_2_and_are_never_printed(
    tmp_path, s3_env, bucket, capsys, monkeypatch
):
    data = write_image_folder(tmp_path / "data")
    secret = "wrong-secret-" + "x" * 27
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    assert _run(data, tmp_path / "out", f"s3://{bucket}/run") == EXIT_CONFIG
    captured = capsys.readouterr()
    assert "credentials were rejected" in captured.err
    assert secret not in captured.out + captured.err
    assert s3_env.secret_key not in captured.out + captured.err


def test_an_endpoint_that_does_not_answer_is_retried_then_exits_2(tmp_path, s3_env, monkeypatch):
    data = write_image_folder(tmp_path / "data")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    args = ["--data-dir", data, "--output-dir", tmp_path / "out", *ONE]
    args += ["--checkpoint-uri", "s3://some-bucket/run", "--checkpoint-upload-timeout-s", "4"]
    result = subprocess.run(
        [sys.executable, "-m", "trainer.train", *map(str, args)],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_CONFIG, result.stdout + result.stderr
    assert "retrying in" in result.stdout  # a short outage is ridden out...
    assert "S3 did not answer for 4s" in result.stderr  # ...a dead endpoint is not
    assert "cannot reach the S3 endpoint" in result.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


# ------------------------------------------------------------------------- mirroring, resume
def test_checkpoints_are_mirrored_complete_and_only_the_newest_k_kept(tmp_path, s3_env, bucket):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    assert _run(data, out, f"s3://{bucket}/runs/a/", "--epochs", "2") == 0
    client = s3_env.client()
    # 18 steps, a checkpoint every 3: the newest 2 complete ones stay, nothing else.
    steps = assert_mirrored(client, bucket, "runs/a", last=18, keep=2, every=3)
    for step in steps:
        state = client.get_object(Bucket=bucket, Key=f"runs/a/step-{step}/state.pt")["Body"].read()
        marker = json.loads(
            client.get_object(Bucket=bucket, Key=f"runs/a/step-{step}/COMPLETE")["Body"].read()
        )
        assert marker["step"] == step and marker["state_bytes"] == len(state)
        assert marker["state_sha256"] == hashlib.sha256(state).hexdigest()
    final = client.get_object(Bucket=bucket, Key="runs/a/step-18/state.pt")["Body"].read()
    assert (out / "checkpoints" / "step-18" / "state.pt").read_bytes() == final
    log = (out / "metrics.jsonl").read_text()  # the run itself went as usual
    assert '"step": 18' in log


def test_a_new_node_resumes_from_s3_and_a_finished_run_uploads_its_last_checkpoint(
    tmp_path, s3_env, bucket, capsys
):
    data = write_image_folder(tmp_path / "data")
    local_only = tmp_path / "first"
    args = ["--data-dir", data, "--output-dir", local_only, *ONE, "--epochs", "1"]
    assert main([str(a) for a in args]) == 0  # no flag: S3 has nothing
    uri = f"s3://{bucket}/run"
    client = s3_env.client()
    assert keys(client, bucket) == []

    capsys.readouterr()
    assert _run(data, local_only, uri, "--epochs", "1") == 0  # finished: only the upload
    captured = capsys.readouterr().out
    assert "step-9 is not in" in captured and "already complete: step 9 of 9" in captured
    assert complete_remote_steps(client, bucket, "run") == [9]

    new_node = tmp_path / "second"
    assert _run(data, new_node, uri, "--epochs", "2") == 0
    captured = capsys.readouterr().out
    assert "downloading step-9" in captured and "resuming at step 9 (epoch 1, batch 0)" in captured
    summary = json.loads((new_node / "summary.json").read_text())
    assert summary["resumed_from_step"] == 9 and summary["steps"] == 18
    assert_mirrored(client, bucket, "run", last=18, keep=2, every=3)


def test_a_folder_without_marker_is_never_resumed_from(tmp_path, s3_env, bucket, capsys):
    """What an upload killed between state.pt and its marker leaves: the state, no marker."""
    data = write_image_folder(tmp_path / "data")
    uri, client = f"s3://{bucket}/run", s3_env.client()
    assert _run(data, tmp_path / "first", uri, "--epochs", "2") == 0
    older = assert_mirrored(client, bucket, "run", last=18, keep=2, every=3)[1]
    client.delete_object(Bucket=bucket, Key="run/step-18/COMPLETE")  # killed before the marker
    client.put_object(Bucket=bucket, Key="run/step-21/state.pt", Body=b"half an upload")

    capsys.readouterr()
    out = tmp_path / "second"
    assert _run(data, out, uri, "--epochs", "3") == 0
    captured = capsys.readouterr().out
    assert f"1 complete checkpoint(s), newest step-{older}" in captured
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == older and summary["steps"] == 27
    # The leftovers were pruned once a newer checkpoint was complete.
    assert_mirrored(client, bucket, "run", last=27, keep=2, every=3)


def test_a_corrupt_newest_remote_checkpoint_falls_back_to_the_previous(
    tmp_path, s3_env, bucket, capsys
):
    data = write_image_folder(tmp_path / "data")
    uri, client = f"s3://{bucket}/run", s3_env.client()
    first = tmp_path / "first"
    for steps in (3, 6, 9):  # each run's last checkpoint is waited for: none is skipped
        assert _run(data, first, uri, "--max-steps", steps, "--keep-checkpoints", "3") == 0
    assert complete_remote_steps(client, bucket, "run") == [9, 6, 3]
    key = "run/step-9/state.pt"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF  # a flipped byte inside the tensors: torch.load would not notice
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))

    capsys.readouterr()
    out = tmp_path / "second"
    assert _run(data, out, uri, "--epochs", "2", "--keep-checkpoints", "3") == 0
    captured = capsys.readouterr()
    assert "step-9/state.pt: its sha256 differs" in captured.err
    assert "step-9/ is unusable" in captured.out and "falling back" in captured.out
    assert "resuming at step 6 (epoch 0, batch 6)" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 6 and summary["steps"] == 18
    corrupt = out / "checkpoints" / "step-9.corrupt"  # kept for inspection, as a local one is
    assert (corrupt / "state.pt").read_bytes() == bytes(body)
    # S3 stopped counting the corrupt copy at once and pruned it later.
    assert_mirrored(client, bucket, "run", last=18, keep=3, every=3)


# ------------------------------------------------------------------------------- the end
def test_sigterm_waits_for_the_checkpoint_to_be_durable_in_s3(tmp_path, s3_env, bucket):
    data = write_image_folder(tmp_path / "data")
    outs = [tmp_path / f"node{r}" for r in range(2)]
    uri = f"s3://{bucket}/run"
    args = [
        [
            str(a)
            for a in [
                "--data-dir",
                data,
                "--output-dir",
                out,
                *TINY,
                "--batch-size",
                "2",
                "--epochs",
                "200",
                "--checkpoint-every-steps",
                "0",
                "--checkpoint-uri",
                uri,
            ]
        ]
        for out in outs
    ]
    procs = start_operator_style(args, log_dir=tmp_path / "logs")
    wait_for_line(tmp_path / "logs" / "rank0.log", "step 3/", procs)
    procs[1].send_signal(signal.SIGTERM)  # the rank that does not write: all must agree
    codes = wait_all(procs)
    log = logs(tmp_path / "logs")
    assert codes == [EXIT_SIGTERM, EXIT_SIGTERM], log
    local = ckpt.complete_checkpoints(outs[0] / "checkpoints")
    assert len(local) == 1, log  # no periodic checkpoints: this is the SIGTERM one
    step = ckpt.step_of(local[0])
    # Complete in S3 by the time the process exited: its upload was waited for.
    assert complete_remote_steps(s3_env.client(), bucket, "run") == [step], log
    assert f"checkpoint step-{step} is durable" in log
    assert files_under(outs[1]) == []


@pytest.mark.slow
def test_a_last_checkpoint_that_cannot_be_made_durable_fails_the_run(tmp_path, s3_env, bucket):
    """The bucket disappears mid-run: the final upload is refused, and the run exits 4."""
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "2", "--epochs", "6"]
    args += ["--checkpoint-every-steps", "0", "--checkpoint-uri", f"s3://{bucket}/run"]
    log = tmp_path / "trainer.log"
    proc = ForkedTrainer([*map(str, args)], env=base_env(), cwd=REPO, log_path=log)
    wait_for_line(log, "0 complete checkpoint(s)", [proc])
    s3_env.client().delete_bucket(Bucket=bucket)
    code = proc.wait(timeout=300)
    text = log.read_text()
    assert code == EXIT_STORAGE, text
    assert "the last checkpoint, step-108, is complete in" in text
    assert "could not be made durable in s3://" in text and "does not exist" in text
    assert ckpt.step_of(ckpt.latest_complete_checkpoint(out / "checkpoints")) == 108
    assert (out / "summary.json").exists()  # the model was exported before the upload failed


# ---------------------------------------------------------------------- two nodes, no sharing
# 36 images, 2 ranks, batch 2 -> 9 steps per epoch, 27 steps; a checkpoint every 4 steps.
NODES_ARGS = RESUME_ARGS  # the same run the local resume tests compare against


def _node_args(data, outs, *extra):
    return [
        [str(a) for a in ["--data-dir", data, "--output-dir", o, *NODES_ARGS, *extra]] for o in outs
    ]


@pytest.mark.slow
def test_a_replica_replaced_by_an_empty_node_resumes_from_s3_bit_exact(
    tmp_path, s3_env, bucket, resume_reference
):
    data = write_image_folder(tmp_path / "data")
    reference = resume_reference  # the uninterrupted run of NODES_ARGS, without S3

    uri, client = f"s3://{bucket}/job", s3_env.client()
    outs = [tmp_path / "node0", tmp_path / "node1"]  # each "node" has its own disk
    procs = start_operator_style(
        _node_args(data, outs, "--checkpoint-uri", uri), log_dir=tmp_path / "logs"
    )
    wait_for_line(tmp_path / "logs" / "rank0.log", "is durable in", procs)
    procs[0].send_signal(signal.SIGKILL)  # the node of rank 0, the one that writes, dies
    codes = wait_all(procs)
    assert codes[0] == -signal.SIGKILL, logs(tmp_path / "logs")
    assert codes[1] != 0  # its peer is gone: the job fails and is restarted, as a whole
    assert not (outs[0] / "model").exists(), "the run finished before the kill"
    durable = complete_remote_steps(client, bucket, "job")
    assert durable and len(durable) <= 2 and durable[0] < 27
    assert all(s % 4 == 0 for s in durable)

    new_outs = [tmp_path / "new-node0", outs[1]]  # rank 0 restarts on an empty disk
    codes, log = run_operator_style(
        _node_args(data, new_outs, "--checkpoint-uri", uri), log_dir=tmp_path / "resume-logs"
    )
    assert codes == [0, 0], log
    summary = json.loads((new_outs[0] / "summary.json").read_text())
    assert summary["resumed_from_step"] == durable[0] and summary["steps"] == 27, log
    assert f"downloading step-{durable[0]} from {uri}" in log
    assert summary["replicas_in_sync"] is True
    resumed = load_weights(new_outs[0] / "model")
    different = [k for k in reference if not torch.equal(reference[k], resumed[k])]
    assert different == [], f"weights differ after resume from S3: {different[:5]}"
    assert files_under(outs[1]) == []  # rank 1 never wrote: it got rank 0's bytes
    # The job's end: the final checkpoint complete in S3, the newest 2 kept, nothing else.
    remote = remote_steps(client, bucket, "job")
    assert max(remote) == 27 and len(remote) == 2, remote
    assert all(names == {"state.pt", "COMPLETE"} for names in remote.values()), remote
