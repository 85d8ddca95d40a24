"""The device a rank trains on, and the settings that go with it.

The trainer never falls back to the CPU quietly when CUDA was asked for (``--device cuda``) or
expected (``--device auto`` in a container given GPUs): a CUDA that fails to start there is
nearly always an image built for a newer CUDA than the node's driver, and training on the CPU
while holding GPUs would waste both. It exits 2 naming the versions instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from trainer.config import TrainConfig
from trainer.distributed import DistEnv, configure_cpu_threads
from trainer.errors import ConfigError

# The oldest Linux driver each CUDA major version runs on (NVIDIA's minor-version compatibility:
# docs.nvidia.com/deploy/cuda-compatibility, "CUDA 13.x >= 580, CUDA 12.x >= 525").
MIN_DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")

# Set on CUDA unless the user set them: NCCL's flight recorder keeps the last collectives and
# writes them out when one times out, so a hang can be diagnosed after the job is gone.
NCCL_FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def select_device(
    config: TrainConfig,
    env: DistEnv,
    environ: Mapping[str, str] = os.environ,
    dev_dir: Path = Path("/dev"),
) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` (modulo the visible GPUs) or the CPU."""
    if config.device == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    if config.device == "cuda":
        raise ConfigError(f"--device cuda, but {cuda_failure_report()}")
    reason = gpus_given_by(environ, dev_dir)
    if reason:
        raise ConfigError(
            f"--device auto: {reason}, so this container was given GPUs, but "
            f"{cuda_failure_report()}"
        )
    return torch.device("cpu")


def gpus_given_by(environ: Mapping[str, str], dev_dir: Path = Path("/dev")) -> str | None:
    """What says this container was given GPUs (``None``: nothing does).

    ``NVIDIA_VISIBLE_DEVICES=all`` alone says nothing: the pytorch/pytorch images set it for
    every container, GPU or not. Device lists (the Kubernetes device plugin sets GPU UUIDs) and
    the ``/dev/nvidiaN`` files the container runtime mounts do.
    """
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(name, "").strip()
        if value and value.lower() not in ("all", "none", "void") and not value.startswith("-"):
            return f"{name}={value}"
    devices = sorted(p.name for p in dev_dir.glob("nvidia[0-9]*") if p.name[6:].isdigit())
    if devices:
        return f"{dev_dir / devices[0]} exists"
    return None


def cuda_failure_report() -> str:
    """Why CUDA does not start: this torch's CUDA, the driver's version, CUDA's own error."""
    built_for = torch.version.cuda
    driver = nvidia_driver_version()
    if built_for is None:
        torch_says = f"this torch {torch.__version__} is a CPU-only build"
        fix = "use the CUDA image (see the Dockerfile's BASE_IMAGE)"
    else:
        major = int(built_for.split(".")[0])
        needed = MIN_DRIVER_FOR_CUDA.get(major)
        torch_says = f"this torch {torch.__version__} is built for CUDA {built_for}" + (
            f", which needs NVIDIA driver >= {needed}" if needed else ""
        )
        fix = (
            "use an image whose CUDA the node's driver supports (Dockerfile BASE_IMAGE, e.g. a "
            "cu12.x base for drivers 525-579) or upgrade the driver"
        )
    driver_says = (
        f"the node's NVIDIA driver is {driver}"
        if driver
        else f"the NVIDIA driver version is not readable ({DRIVER_VERSION_FILE} is missing: "
        "no driver mounted into the container?)"
    )
    return (
        f"CUDA does not start: {torch_says}; {driver_says}; CUDA says: {cuda_init_error()}. "
        f"Fix: {fix}, or pass --device cpu to train on the CPU on purpose"
    )


def nvidia_driver_version(version_file: Path = DRIVER_VERSION_FILE) -> str | None:
    """The kernel driver's version (``580.95.05``), if the container can read it."""
    try:
        text = version_file.read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \w+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else text.strip().splitlines()[0]


def cuda_init_error() -> str:
    """The error CUDA's initialisation raises here (it names e.g. an old driver's version)."""
    try:
        torch.cuda.init()
    except Exception as err:  # AssertionError on a CPU-only build, RuntimeError from the driver
        return f"{type(err).__name__}: {err}"
    if torch.cuda.device_count() == 0:
        return "no CUDA device is visible (torch.cuda.device_count() is 0)"
    return "no error, yet torch.cuda.is_available() is False"


def settle_for_device(config: TrainConfig, device: torch.device, env: DistEnv) -> TrainConfig:
    """The config with its device-dependent defaults filled in (channels_last, compile), and
    checked."""
    if config.grad_compression == "bf16" and device.type != "cuda" and env.distributed:
        raise ConfigError(
            "--grad-compression bf16 needs CUDA (NCCL); DDP refuses it over gloo on the CPU. "
            "Use --grad-compression fp16 or none"
        )
    cuda = device.type == "cuda"
    return dataclasses.replace(
        config,
        channels_last=cuda if config.channels_last is None else config.channels_last,
        compile=cuda if config.compile is None else config.compile,
    )


def configure_backends(config: TrainConfig, device: torch.device, env: DistEnv) -> None:
    """CPU threads, determinism switches, NCCL diagnostics, cuDNN/TF32 speed settings on CUDA."""
    if device.type == "cpu":
        configure_cpu_threads(env)
        if config.channels_last and env.is_main:
            print(
                "[trainer] WARNING: --channels-last on CPU: measured ~10x slower training than "
                "the default memory format with torch 2.13 (CPU); it pays off on CUDA",
                file=sys.stderr,
                flush=True,
            )
    else:
        for name, value in NCCL_FLIGHT_RECORDER.items():
            os.environ.setdefault(name, value)
        trace_prefix = Path(config.output_dir).absolute() / "nccl_trace_rank_"
        os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(trace_prefix))
    if config.compile:
        # Inductor's own default names the folder after getpass.getuser(), which fails for a UID
        # without a passwd entry (OpenShift's restricted-v2 runs images as an arbitrary UID).
        default = Path(tempfile.gettempdir()) / f"torchinductor_{os.getuid()}"
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default))
    if config.deterministic:
        # Must be set before cuBLAS initialises; harmless on CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    elif device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
