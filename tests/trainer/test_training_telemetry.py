"""TensorBoard event files (read back with TensorBoard's own reader), the metrics endpoint of a
one-process run, and what the flags switch off."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.trainer.trainer_forkserver import ForkedTrainer
from tests.trainer.trainer_launch import REPO, base_env, free_port
from trainer.config import TrainConfig
from trainer.errors import ConfigError
from trainer.train import main

TINY = ["--model", "mobilenet_v3_small", "--image-size", "16", "--batch-size", "4"]
SYNTHETIC = ["--synthetic", "--synthetic-size", "64", "--num-classes", "3"]


def test_tensorboard_scalars_read_back_with_tensorboards_reader(tmp_path, image_folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    args = ["--data-dir", str(image_folder), *TINY, "--epochs", "2", "--log-interval", "3"]
    assert main([*args, "--output-dir", str(out)]) == 0  # 36 images / batch 4: 9 steps an epoch

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags >= {
        "train/loss",
        "train/learning_rate",
        "train/images_per_second",
        "train/epoch",
        "time/data_wait_seconds",
        "time/compute_seconds",
        "time/checkpoint_stall_seconds",
        "val/loss",
        "val/accuracy",
    }
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [3, 6, 9, 12, 15, 18]
    assert all(e.value > 0 for e in events.Scalars("train/images_per_second"))
    assert [e.step for e in events.Scalars("val/accuracy")] == [9, 18]
    assert all(0.0 <= e.value <= 1.0 for e in events.Scalars("val/accuracy"))
    compute = [e.value for e in events.Scalars("time/compute_seconds")]
    assert all(0 < seconds < 10 for seconds in compute)


def test_tensorboard_none_writes_no_event_files(tmp_path):
    out = tmp_path / "out"
    args = [*SYNTHETIC, *TINY, "--max-steps", "2", "--tensorboard-dir", "none"]
    assert main([*args, "--output-dir", str(out)]) == 0
    assert not (out / "tensorboard").exists()
    assert (out / "summary.json").is_file()


def test_tensorboard_dir_defaults_into_the_output_folder(tmp_path):
    config = TrainConfig(output_dir=tmp_path / "o", synthetic=True)
    assert config.tensorboard_path == tmp_path / "o" / "tensorboard"
    for off in ("none", "NONE", ""):
        config = TrainConfig(output_dir=tmp_path, synthetic=True, tensorboard_dir=off)
        assert config.tensorboard_path is None, off
    elsewhere = TrainConfig(output_dir=tmp_path, synthetic=True, tensorboard_dir="/tb/run-1")
    assert elsewhere.tensorboard_path == Path("/tb/run-1")


@pytest.mark.parametrize("port", [-1, 70000])
def test_a_bad_metrics_port_names_the_flag(tmp_path, port):
    with pytest.raises(ConfigError, match="--metrics-port"):
        TrainConfig(output_dir=tmp_path, synthetic=True, metrics_port=port)


def test_a_one_process_run_serves_its_metrics_and_needs_nothing_when_off(tmp_path):
    """Off (the default): neither prometheus_client nor tensorboard is imported. On: the endpoint
    answers with the job's labels while the run trains."""
    code = (
        "import sys\n"
        "from trainer.train import main\n"
        f"args = {[*SYNTHETIC, *TINY, '--max-steps', '2', '--tensorboard-dir', 'none']!r}\n"
        f"assert main([*args, '--output-dir', {str(tmp_path / 'off')!r}]) == 0\n"
        "print(sorted(m for m in ('prometheus_client', 'tensorboard') if m in sys.modules))\n"
    )
    off = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=base_env(), capture_output=True, text=True
    )
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip().splitlines()[-1] == "[]"

    port = free_port()
    args = [*SYNTHETIC, *TINY, "--epochs", "1000", "--max-steps", "100000", "--log-interval", "2"]
    args += ["--metrics-port", str(port), "--metrics-job", "demo", "--output-dir", str(tmp_path)]
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "trainer.log"
    trainer = ForkedTrainer(args, env=base_env(), cwd=REPO, log_path=log, new_session=True)
    try:
        text = _scrape_until(port, 'kfp_ddp_train_images_per_second{job="demo"', trainer)
    finally:
        trainer.kill()
        trainer.wait(timeout=30)
    labels = '{job="demo",node_rank="0",rank="0"}'
    for name in ("step", "loss", "learning_rate", "seconds_since_last_step", "restarts"):
        assert f"kfp_ddp_train_{name}{labels}" in text, name
    assert f"kfp_ddp_train_resumed_from_step{labels} -1.0" in text
    assert f"kfp_ddp_train_data_wait_seconds_total{labels}" in text


def _scrape_until(port: int, wanted: str, trainer: ForkedTrainer, timeout: float = 60) -> str:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and trainer.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                text = answer.read().decode()
            if wanted in text:
                return text
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{wanted} not served on port {port} (trainer exit {trainer.poll()})")


def test_the_output_upload_takes_the_tensorboard_folder(tmp_path, s3_env, bucket):
    """--output-uri: the event files go to S3 with the model (what the evaluation page names)."""
    from tests.trainer.s3_mirror_helpers import keys

    out = tmp_path / "out"
    args = [*SYNTHETIC, *TINY, "--max-steps", "3", "--log-interval", "1"]
    assert main([*args, "--output-dir", str(out), "--output-uri", f"s3://{bucket}/run/output"]) == 0
    uploaded = keys(s3_env.client(), bucket, "run/output/")
    events = [k for k in uploaded if k.startswith("run/output/tensorboard/events.out.tfevents.")]
    assert len(events) == 1 and "run/output/summary.json" in uploaded
