"""Start real trainer processes the way torchrun and the Training Operator do (loopback only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from kfp_ddp.free_ports import free_port
from tests.trainer.trainer_forkserver import ForkedTrainer

REPO = Path(__file__).resolve().parents[2]
DIST_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
# A tiny model (with dropout, BatchNorm and SGD momentum state) on 16 px images: seconds per run.
TINY = ["--model", "mobilenet_v3_small", "--image-size", "16", "--log-interval", "1"]
# Short timeouts turn a stuck peer into an error in the logs, not a silent hang.
TINY += ["--init-timeout-s", "90", "--collective-timeout-s", "90"]
# 36 training images, 2 ranks, batch 2 → 9 steps per epoch; checkpoints every 4 steps are all
# mid-epoch (4, 8, 12, 16, 20, 24), the end (27) closes epoch 3.
RESUME_ARGS = [
    *TINY,
    "--batch-size",
    "2",
    "--epochs",
    "3",
    "--deterministic",
    "--seed",
    "7",
    "--lr",
    "2.0",
    "--checkpoint-every-steps",
    "4",
    "--keep-checkpoints",
    "2",
]


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    return env


def start_operator_style(rank_args: list[list[str]], *, log_dir: Path) -> list[ForkedTrainer]:
    """One ``python -m trainer.train`` per "pod" (forked: :mod:`tests.trainer.trainer_forkserver`),
    with RANK = pod index, WORLD_SIZE, MASTER_*, PET_*."""
    port, world = free_port(), len(rank_args)
    procs = []
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank, args in enumerate(rank_args):
        env = base_env() | {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PET_NNODES": str(world),
            "PET_NODE_RANK": str(rank),
            "PET_NPROC_PER_NODE": "1",
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
        }
        procs.append(ForkedTrainer(args, env=env, cwd=REPO, log_path=log_dir / f"rank{rank}.log"))
    return procs


def wait_all(procs: list[ForkedTrainer], timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
    return codes


def logs(log_dir: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(log_dir.glob("*.log"))
    )


def run_operator_style(rank_args: list[list[str]], *, log_dir: Path, timeout: float = 120):
    try:
        codes = wait_all(start_operator_style(rank_args, log_dir=log_dir), timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"trainers still running after {timeout}s\n{logs(log_dir)}") from None
    return codes, logs(log_dir)


def our_torchrun_command(args: list, *, nproc: int) -> list[str]:
    """``python -m trainer.torchrun`` (the pod's entry point) of ``nproc`` trainers on this
    machine, each with ``args``."""
    launch = [sys.executable, "-m", "trainer.torchrun", "--standalone", f"--nproc_per_node={nproc}"]
    return [*launch, "-m", "trainer.train", *map(str, args)]


def run_torchrun(args: list[str], *, nproc: int = 2, timeout: float = 120):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "trainer.train",
        *args,
    ]
    return subprocess.run(
        command, cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=timeout
    )


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(model_dir / "weights.pt", map_location="cpu", weights_only=True)


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")) if folder.exists() else []
