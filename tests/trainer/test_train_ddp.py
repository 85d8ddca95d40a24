"""Two-process DDP training on CPU (gloo): completes, replicas agree, only rank 0 writes."""

from __future__ import annotations

import json

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import (
    TINY,
    files_under,
    load_weights,
    run_operator_style,
    run_torchrun,
)
from trainer.export import load_model


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path):
    data = write_image_folder(tmp_path / "data")
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4", "--epochs", "2"]
    result = run_torchrun([str(a) for a in args])
    assert result.returncode == 0, result.stdout + result.stderr

    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["steps"] == 2 * 4  # 36 images / 2 ranks / batch 4 → 4 steps per epoch
    assert summary["replicas_in_sync"] is True  # sha256 of every rank's weights, all gathered
    assert summary["resumed_from_step"] is None and summary["restarts"] == 0
    assert 0.0 <= summary["val_accuracy"] <= 1.0

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))  # rank 0 only: no duplicate lines
    assert {"loss", "lr", "images_per_sec", "elapsed_s", "epoch"} <= train[0].keys()
    assert [r["step"] for r in records if r["type"] == "val"] == [4, 8]

    model, info = load_model(out / "model")
    assert info["arch"] == "mobilenet_v3_small" and info["class_names"] == [
        "circle",
        "square",
        "stripe",
    ]
    assert model(torch.zeros(1, 3, 16, 16)).shape == (1, 3)
    assert (out / "checkpoints" / "step-8" / "COMPLETE").is_file()
    assert "step 8/8" in result.stdout and "ETA" in result.stdout


def test_operator_style_rank1_writes_nothing_and_weights_match(tmp_path):
    """Each "pod" gets its own output and checkpoint dir; rank 1's must stay empty."""
    data = write_image_folder(tmp_path / "data")
    common = [*TINY, "--batch-size", "4", "--max-steps", "5", "--checkpoint-every-steps", "2"]
    dirs = [(tmp_path / f"out{r}", tmp_path / f"ckpt{r}") for r in range(2)]
    for out, ckpt in dirs:
        out.mkdir()
        ckpt.mkdir()
    rank_args = [
        [
            str(a)
            for a in ["--data-dir", data, "--output-dir", out, "--checkpoint-dir", ckpt, *common]
        ]
        for out, ckpt in dirs
    ]
    codes, log = run_operator_style(rank_args, log_dir=tmp_path / "logs")
    assert codes == [0, 0], log

    (out0, ckpt0), (out1, ckpt1) = dirs
    assert files_under(out1) == [] and files_under(ckpt1) == [], "rank 1 wrote files"
    assert sorted(p.name for p in ckpt0.iterdir()) == ["step-2", "step-4", "step-5"]
    summary = json.loads((out0 / "summary.json").read_text())
    assert summary["replicas_in_sync"] is True and summary["steps"] == 5
    assert "operator" in log
    # The exported weights are rank 0's; the in-sync digest covered rank 1's copy too.
    assert load_weights(out0 / "model").keys()
