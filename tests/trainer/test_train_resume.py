"""Crash safety: SIGKILL → bit-exact resume, SIGTERM → checkpoint + 143, corrupt → fall back."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import (
    RESUME_ARGS,
    TINY,
    files_under,
    load_weights,
    logs,
    run_operator_style,
    start_operator_style,
    wait_all,
)
from trainer import checkpoint as ckpt
from trainer.train import main


def _rank_args(data, tmp_path, name, extra=()):
    out = [tmp_path / f"{name}-out{r}" for r in range(2)]
    return out, [
        [str(a) for a in ["--data-dir", data, "--output-dir", o, *RESUME_ARGS, *extra]] for o in out
    ]


def _wait_for(predicate, procs, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if all(p.poll() is not None for p in procs):
            raise AssertionError("the trainers exited before the awaited event")
        time.sleep(0.005)
    raise AssertionError("timed out")


@pytest.mark.slow
@pytest.mark.parametrize(
    "data_path",
    [(), ("--cache-images", "never", "--num-workers", "1")],
    ids=["cached-in-memory", "streamed-by-a-worker"],
)
def test_sigkill_mid_epoch_then_resume_is_bit_exact(tmp_path, data_path, request):
    data = write_image_folder(tmp_path / "data")

    if data_path:
        ref_out, ref_args = _rank_args(data, tmp_path, "ref", data_path)
        codes, log = run_operator_style(ref_args, log_dir=tmp_path / "ref-logs")
        assert codes == [0, 0], log
        reference = load_weights(ref_out[0] / "model")
    else:  # the same run as the S3 resume test's: made once per session
        reference = request.getfixturevalue("resume_reference")

    out, args = _rank_args(data, tmp_path, "crash", data_path)
    checkpoints = out[0] / "checkpoints"
    procs = start_operator_style(args, log_dir=tmp_path / "crash-logs")
    _wait_for(lambda: ckpt.latest_complete_checkpoint(checkpoints) is not None, procs)
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    assert wait_all(procs) == [-signal.SIGKILL, -signal.SIGKILL]
    assert not (out[0] / "model").exists(), "the run finished before it was killed"
    assert files_under(out[1]) == []

    codes, log = run_operator_style(args, log_dir=tmp_path / "resume-logs")
    assert codes == [0, 0], log
    summary = json.loads((out[0] / "summary.json").read_text())
    resumed = summary["resumed_from_step"]
    assert resumed is not None and 4 <= resumed < 27 and resumed % 9 != 0, summary
    assert summary["restarts"] == 1 and summary["steps"] == 27
    assert summary["replicas_in_sync"] is True
    assert f"resuming at step {resumed} (epoch {resumed // 9}, batch {resumed % 9})" in log
    # Rank 1 had no checkpoint of its own: it resumed from the bytes rank 0 broadcast.
    assert files_under(out[1]) == []

    resumed_weights = load_weights(out[0] / "model")
    assert reference.keys() == resumed_weights.keys()
    different = [k for k in reference if not torch.equal(reference[k], resumed_weights[k])]
    assert different == [], f"weights differ after resume: {different[:5]}"
    # The run really trained (the comparison is not between two untouched initialisations).
    assert summary["final_train_loss"] is not None


def test_sigterm_to_one_rank_checkpoints_the_current_step_and_exits_143(tmp_path):
    data = write_image_folder(tmp_path / "data")
    outs = [tmp_path / f"out{r}" for r in range(2)]
    args = [
        [
            str(a)
            for a in [
                "--data-dir",
                data,
                "--output-dir",
                o,
                *TINY,
                "--batch-size",
                "2",
                "--epochs",
                "200",
                "--checkpoint-every-steps",
                "0",
            ]
        ]
        for o in outs
    ]
    procs = start_operator_style(args, log_dir=tmp_path / "logs")
    metrics = outs[0] / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, procs)
    procs[1].send_signal(signal.SIGTERM)  # only the non-writing rank is told; all must agree
    codes = wait_all(procs)
    log = logs(tmp_path / "logs")
    assert codes == [143, 143], log

    complete = ckpt.complete_checkpoints(outs[0] / "checkpoints")
    assert len(complete) == 1, log  # no periodic checkpoints: this is the SIGTERM one
    state = torch.load(complete[0] / ckpt.STATE_FILE, map_location="cpu", weights_only=True)
    step = int(complete[0].name.removeprefix("step-"))
    assert state["step"] == step >= 3 and step < 200 * 9
    assert state["batch_in_epoch"] == step % 9 and state["epoch"] == step // 9
    assert set(ckpt.REQUIRED_KEYS) <= state.keys()
    assert f"stopped by SIGTERM at step {step}" in log
    assert not (outs[0] / "model").exists()
    assert files_under(outs[1]) == []


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path, capsys):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    # One process: 36 images, batch 4 → 9 steps per epoch; checkpoints at 3, 6, 9.
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4"]
    args += ["--checkpoint-every-steps", "3", "--keep-checkpoints", "5"]
    assert main([str(a) for a in [*args, "--epochs", "1"]]) == 0
    root = out / "checkpoints"
    assert [p.name for p in ckpt.complete_checkpoints(root)] == ["step-9", "step-6", "step-3"]

    (root / "step-9" / ckpt.STATE_FILE).write_bytes(b"not a torch file")
    leftover = root / "step-12"  # an interrupted save: no marker, must be ignored
    leftover.mkdir()
    (leftover / ckpt.STATE_FILE).write_bytes(b"partial")
    capsys.readouterr()

    assert main([str(a) for a in [*args, "--epochs", "2"]]) == 0
    captured = capsys.readouterr()
    assert "step-9 is unusable" in captured.err and "falling back" in captured.err
    assert "resuming at step 6 (epoch 0, batch 6)" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 6 and summary["restarts"] == 1
    assert summary["steps"] == 18
    assert (root / "step-9.corrupt").is_dir()  # set aside for inspection, never resumed from
    assert ckpt.is_complete(root / "step-9") and ckpt.is_complete(root / "step-12")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["type"] == "train"]
    assert train_steps == list(range(1, 19))  # records past step 6 of the first run were dropped


def test_checkpoint_contents_are_plain_and_complete(tmp_path):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4", "--max-steps", "2"]
    assert main([str(a) for a in args]) == 0
    folder = ckpt.latest_complete_checkpoint(out / "checkpoints")
    assert folder is not None and folder.name == "step-2"
    marker = json.loads((folder / ckpt.MARKER_FILE).read_text())
    assert marker["step"] == 2
    state = torch.load(folder / ckpt.STATE_FILE, map_location="cpu", weights_only=True)
    assert state["step"] == 2 and state["epoch"] == 0 and state["batch_in_epoch"] == 2
    assert state["config"]["model"] == "mobilenet_v3_small"
    assert state["rng"] == {"scheme": "derive_seed(seed, epoch, step, rank)", "seed": 0}
    assert state["optimizer"]["state"], "optimizer state (momentum) must be saved"
    assert state["scheduler"]["last_epoch"] == 2
    assert not list(folder.parent.glob("**/*.tmp")), "temp files left behind"


def test_restart_after_completion_says_already_complete_and_changes_nothing(tmp_path, capsys):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4", "--max-steps", "3"]
    assert main([str(a) for a in args]) == 0
    written = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files_under(out) if p.is_file()}
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0  # e.g. the pod was restarted after finishing
    assert "already complete: step 3 of 3" in capsys.readouterr().out
    now = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files_under(out) if p.is_file()}
    assert now == written  # summary.json, model/, metrics.jsonl, checkpoints: untouched
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] is None and summary["restarts"] == 0
    assert summary["images_per_sec"] is not None


def test_restart_after_the_final_checkpoint_but_before_export_exports(tmp_path):
    """A run killed between its last checkpoint and its summary finishes the job on restart."""
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4", "--max-steps", "3"]
    assert main([str(a) for a in args]) == 0
    first = load_weights(out / "model")
    (out / "summary.json").unlink()
    assert main([str(a) for a in args]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["steps"] == 3 and summary["restarts"] == 1
    second = load_weights(out / "model")
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_resume_with_another_world_size_restarts_the_epoch(tmp_path, capsys):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    common = [*TINY, "--batch-size", "4", "--checkpoint-every-steps", "3"]
    two = [
        [str(a) for a in ["--data-dir", data, "--output-dir", o, *common, "--max-steps", "3"]]
        for o in (out, tmp_path / "rank1-out")
    ]
    codes, log = run_operator_style(two, log_dir=tmp_path / "logs")
    assert codes == [0, 0], log
    args = ["--data-dir", data, "--output-dir", out, *common, "--max-steps", "5"]
    assert main([str(a) for a in args]) == 0  # now a single process
    captured = capsys.readouterr().out
    assert "world size 2 and batch 4; now 1 and 4: restarting epoch 0" in captured
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["steps"] == 5
    assert summary["world_size"] == 1


def test_resume_refuses_a_checkpoint_of_other_training_settings(tmp_path, capsys):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    common = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4"]
    assert main([str(a) for a in [*common, "--max-steps", "2", "--augment", "none"]]) == 0
    capsys.readouterr()
    code = main([str(a) for a in [*common, "--max-steps", "3", "--augment", "crop-flip"]])
    assert code == 2
    err = capsys.readouterr().err
    assert "--augment 'none' -> 'crop-flip'" in err and "new --output-dir" in err
    # The refused run changed nothing: the finished run is still there, untouched.
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_sigkill_while_a_background_write_is_in_flight_then_resume_is_bit_exact(tmp_path):
    """Checkpoints are written by a thread while training goes on; a half-written one is ignored."""
    data = write_image_folder(tmp_path / "data")
    every_step = ("--checkpoint-every-steps", "1", "--max-steps", "14")
    ref_out, ref_args = _rank_args(data, tmp_path, "ref", every_step)
    codes, log = run_operator_style(ref_args, log_dir=tmp_path / "ref-logs")
    assert codes == [0, 0], log
    reference = load_weights(ref_out[0] / "model")

    out, args = _rank_args(data, tmp_path, "crash", every_step)
    root = out[0] / "checkpoints"

    def writing() -> bool:
        """A complete checkpoint to resume from, and a newer one being written right now."""
        complete = ckpt.complete_checkpoints(root)
        steps = ckpt.step_dirs(root)
        return bool(complete) and bool(steps) and not ckpt.is_complete(steps[-1][1])

    procs = start_operator_style(args, log_dir=tmp_path / "crash-logs")
    _wait_for(writing, procs)
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    assert wait_all(procs) == [-signal.SIGKILL, -signal.SIGKILL]
    newest_step, newest = ckpt.step_dirs(root)[-1]
    assert not ckpt.is_complete(newest), "the write finished before the kill; nothing was tested"
    resumable = int(ckpt.complete_checkpoints(root)[0].name.removeprefix("step-"))
    assert resumable < newest_step

    codes, log = run_operator_style(args, log_dir=tmp_path / "resume-logs")
    assert codes == [0, 0], log
    summary = json.loads((out[0] / "summary.json").read_text())
    assert summary["resumed_from_step"] == resumable and summary["steps"] == 14
    resumed = load_weights(out[0] / "model")
    different = [k for k in reference if not torch.equal(reference[k], resumed[k])]
    assert different == [], f"weights differ after resume: {different[:5]}"
    assert files_under(out[1]) == []


@pytest.mark.slow
def test_a_compiled_run_resumes_bit_exact(tmp_path, monkeypatch):
    """--compile (the default on CUDA): a run that starts from another run's step-2 checkpoint,
    as one killed after that checkpoint would (compiling afresh at step 3), ends with the weights
    of the run that never stopped; the compiled model checkpoints plain state_dict keys."""
    # Inductor's cache outlives the session (keyed by torch's version and the graph, as the
    # trainer's default folder is): a warm suite loads the compiled kernels instead of building
    # them (~60 s cold). Each run still compiles its own model (torch.compile, new trace).
    cache = Path(tempfile.gettempdir()) / f"kfp-ddp-tests-inductor-{os.getuid()}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    data = write_image_folder(tmp_path / "data")
    # squeezenet1_1 compiles in half mobilenet_v3_small's time on CPU (27 s against 60 cold).
    args = [*TINY, "--model", "squeezenet1_1", "--image-size", "32"]
    args += ["--batch-size", "4", "--max-steps", "4", "--compile"]
    args += ["--checkpoint-every-steps", "2", "--keep-checkpoints", "5", "--data-dir", data]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main([str(a) for a in [*args, "--output-dir", straight]]) == 0
    shutil.copytree(straight / "checkpoints" / "step-2", resumed / "checkpoints" / "step-2")
    assert main([str(a) for a in [*args, "--output-dir", resumed]]) == 0
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 4
    expected, got = load_weights(straight / "model"), load_weights(resumed / "model")
    assert expected.keys() == got.keys() and not any("_orig_mod" in k for k in expected)
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert different == [], f"weights differ after resume: {different[:5]}"
