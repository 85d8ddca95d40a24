"""A training whose loss and weights went to nan stops with exit 2 naming --lr (trainer.divergence),
where it ran to its last step and exported a nan model; a nan loss with intact weights (an
overflow fp16's GradScaler skipped) goes on."""

from __future__ import annotations

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import TINY
from trainer.divergence import check_divergence
from trainer.errors import EXIT_CONFIG, ConfigError
from trainer.train import main


def test_only_a_nan_loss_with_weights_no_longer_finite_stops():
    model = torch.nn.Linear(3, 2)
    check_divergence(1.25, model, None, step=5, lr=0.1, warmup=0)
    check_divergence(float("nan"), model, None, step=5, lr=0.1, warmup=0)  # skipped by a scaler
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    check_divergence(0.5, model, None, step=6, lr=0.1, warmup=0)  # the loss decides to look
    with pytest.raises(ConfigError) as err:
        check_divergence(float("nan"), model, None, step=7, lr=1000.0, warmup=3)
    message = str(err.value)
    assert message.startswith("the training diverged: the loss is nan at step 7")
    assert "lower --lr (in the pipeline lr; now 1000)" in message
    assert "--warmup-steps, now 3" in message


def test_a_run_that_diverges_exits_2_and_exports_nothing(tmp_path, capsys):
    data = write_image_folder(tmp_path / "data", per_class=8)
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4", "--lr", "1e9"]
    assert main([str(a) for a in args]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "the training diverged: the loss is nan at step" in err, err
    assert not (out / "model").exists() and not (out / "summary.json").exists()
