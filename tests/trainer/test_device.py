"""Device choice: no quiet CPU fallback when GPUs were given; device-dependent defaults.

The refusal is tested on this CPU machine by giving the process the signal a GPU container has
(its environment); CUDA itself is never faked. Tests that need CUDA skip where it is absent.
"""

from __future__ import annotations

import os

import pytest
import torch

from trainer.build import Precision, RunPlan, build_parts
from trainer.config import TrainConfig
from trainer.device import (
    configure_backends,
    gpus_given_by,
    nvidia_driver_version,
    settle_for_device,
)
from trainer.distributed import DistEnv
from trainer.errors import ConfigError
from trainer.train import run_training

NO_CUDA = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CUDA starts here: there is no failure to refuse"
)
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, None),  # baked into pytorch/pytorch images
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, None),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-5f1c0a"}, "NVIDIA_VISIBLE_DEVICES=GPU-5f1c0a"),
        ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, "NVIDIA_VISIBLE_DEVICES=0,1"),
        ({"CUDA_VISIBLE_DEVICES": "3"}, "CUDA_VISIBLE_DEVICES=3"),
    ],
)
def test_what_says_the_container_was_given_gpus(tmp_path, environ, expected):
    assert gpus_given_by(environ, dev_dir=tmp_path) == expected


def test_device_files_say_so_too(tmp_path):
    (tmp_path / "nvidiactl").touch()  # the control device alone is no GPU
    assert gpus_given_by({}, dev_dir=tmp_path) is None
    (tmp_path / "nvidia0").touch()
    assert gpus_given_by({}, dev_dir=tmp_path) == f"{tmp_path / 'nvidia0'} exists"


@pytest.mark.parametrize(
    "text",
    [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul  8 18:21:16 UTC 2025",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build",
    ],
)
def test_driver_version_is_read_from_proc(tmp_path, text):
    version_file = tmp_path / "version"
    version_file.write_text(text + "\nGCC version:  gcc version 12.2.0\n")
    assert nvidia_driver_version(version_file) == "570.172.08"
    assert nvidia_driver_version(tmp_path / "missing") is None


@NO_CUDA
def test_auto_refuses_the_cpu_when_the_container_was_given_gpus(image_folder, tmp_path, capsys):
    config = TrainConfig(output_dir=tmp_path / "out", data_dir=image_folder, device="auto")
    code = run_training(config, environ={"NVIDIA_VISIBLE_DEVICES": "GPU-5f1c0a"})
    assert code == 2
    err = capsys.readouterr().err
    assert "--device auto: NVIDIA_VISIBLE_DEVICES=GPU-5f1c0a" in err
    assert "CUDA does not start" in err and torch.__version__ in err
    assert "NVIDIA driver" in err and "CUDA says:" in err and "--device cpu" in err
    assert not (tmp_path / "out").exists()


@NO_CUDA
def test_device_cuda_without_cuda_exits_2_naming_the_cause(image_folder, tmp_path, capsys):
    config = TrainConfig(output_dir=tmp_path / "out", data_dir=image_folder, device="cuda")
    assert run_training(config, environ={}) == 2
    err = capsys.readouterr().err
    assert "--device cuda, but CUDA does not start" in err and "CUDA says:" in err


def test_auto_without_a_gpu_signal_trains_on_the_cpu(image_folder, tmp_path):
    from tests.trainer.trainer_launch import TINY
    from trainer.train import main

    if gpus_given_by({}) or torch.cuda.is_available():
        pytest.skip("this machine has GPUs: auto would rightly use or demand them")
    args = ["--data-dir", image_folder, "--output-dir", tmp_path / "out", *TINY]
    assert main([str(a) for a in [*args, "--max-steps", "1", "--batch-size", "4"]]) == 0


def test_device_dependent_defaults(tmp_path):
    config = TrainConfig(output_dir=tmp_path, synthetic=True)
    assert config.channels_last is None
    one = DistEnv()
    assert settle_for_device(config, torch.device("cpu"), one).channels_last is False
    assert settle_for_device(config, torch.device("cuda", 0), one).channels_last is True
    explicit = TrainConfig(output_dir=tmp_path, synthetic=True, channels_last=False)
    assert settle_for_device(explicit, torch.device("cuda", 0), one).channels_last is False
    # torch.compile: on with CUDA (1.42x ResNet-50 on an H100), off on the CPU, unless set.
    assert config.compile is None
    assert settle_for_device(config, torch.device("cpu"), one).compile is False
    assert settle_for_device(config, torch.device("cuda", 0), one).compile is True
    for chosen in (True, False):
        fixed = TrainConfig(output_dir=tmp_path, synthetic=True, compile=chosen)
        assert settle_for_device(fixed, torch.device("cuda", 0), one).compile is chosen
        assert settle_for_device(fixed, torch.device("cpu"), one).compile is chosen
    two = DistEnv(rank=0, world_size=2, master_addr="127.0.0.1", master_port=1)
    bf16 = TrainConfig(output_dir=tmp_path, synthetic=True, grad_compression="bf16")
    with pytest.raises(ConfigError, match="--grad-compression bf16 needs CUDA"):
        settle_for_device(bf16, torch.device("cpu"), two)


def test_nccl_flight_recorder_defaults_leave_user_settings_alone(tmp_path, monkeypatch):
    for name in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.setenv(name, "")  # recorded, so the teardown removes what the code sets
        monkeypatch.delenv(name)
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")  # the user's choice
    config = TrainConfig(output_dir=tmp_path / "out", synthetic=True)
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
    )
    try:
        configure_backends(config, torch.device("cuda", 0), DistEnv())
    finally:
        (
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32,
        ) = saved

    assert os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(
        (tmp_path / "out").absolute() / "nccl_trace_rank_"
    )


@pytest.mark.parametrize(
    ("global_batch", "steps_per_epoch", "total", "setting", "expected"),
    [
        (64, 100, 1000, None, 0),  # LR not scaled up: no warm-up
        (256, 5000, 450000, None, 0),
        (16384, 78, 7020, None, 390),  # 64 GPUs x 256, 90 epochs: 5 epochs
        (2048, 625, 56250, None, 2000),  # 8 GPUs x 256: capped at 2000 steps
        (2048, 625, 3125, None, 312),  # a short run: a tenth of it
        (16384, 78, 7020, 0, 0),  # switched off
        (64, 100, 1000, 50, 50),
    ],
)
def test_warmup_default_when_the_lr_is_scaled_up(
    tmp_path, global_batch, steps_per_epoch, total, setting, expected
):
    config = TrainConfig(output_dir=tmp_path, synthetic=True, warmup_steps=setting)
    warmup = config.warmup_for(
        global_batch=global_batch, steps_per_epoch=steps_per_epoch, total_steps=total
    )
    assert warmup == expected


@NEEDS_CUDA
def test_on_cuda_sgd_is_fused_and_the_model_channels_last(tmp_path):
    device = torch.device("cuda", 0)
    config = settle_for_device(TrainConfig(output_dir=tmp_path, synthetic=True), device, DistEnv())
    plan = RunPlan(steps_per_epoch=10, total_steps=10, global_batch=64, warmup_steps=0)
    parts = build_parts(
        config,
        num_classes=10,
        plan=plan,
        device=device,
        precision=Precision.resolve("auto", device),
    )
    assert parts.optimizer.defaults.get("fused") is True
    conv = next(p for p in parts.model.parameters() if p.ndim == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last)


def test_compile_caches_in_a_folder_any_uid_can_name(tmp_path, monkeypatch):
    """Inductor's default cache folder needs a passwd entry for the UID; ours needs none."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    config = TrainConfig(output_dir=tmp_path / "out", synthetic=True, compile=True)
    configure_backends(config, torch.device("cpu"), DistEnv())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / f"torchinductor_{os.getuid()}")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/volume/inductor")  # the user's choice stays
    configure_backends(config, torch.device("cpu"), DistEnv())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/volume/inductor"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    configure_backends(
        TrainConfig(output_dir=tmp_path, synthetic=True), torch.device("cpu"), DistEnv()
    )
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # no compile, nothing set
