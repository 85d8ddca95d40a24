"""Out of memory: one line naming the settings that decide a process's memory, exit 5 (not
retried), from a real allocation failure under torchrun and from CUDA's error."""

from __future__ import annotations

import resource
import subprocess
from types import SimpleNamespace

import torch

from tests.trainer.trainer_launch import REPO, base_env, our_torchrun_command
from trainer.errors import EXIT_MEMORY
from trainer.out_of_memory import is_out_of_memory, out_of_memory


def _address_space_of(limit_bytes: int):
    """A preexec_fn: the child may map at most ``limit_bytes`` (its allocations fail past it,
    as on a node whose memory is exhausted)."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def test_out_of_memory_is_one_line_naming_the_settings_and_not_retried(tmp_path):
    """A batch whose activations do not fit: torch's allocator fails in the first step. The pod's
    log ended with a traceback through the model's layers and exit 1; now its last line names
    the settings and what to lower, and the exit (5) is permanent."""
    args = ["--synthetic", "--synthetic-size", "2", "--output-dir", tmp_path / "out"]
    args += ["--model", "resnet18", "--image-size", "4096", "--batch-size", "2"]
    command = our_torchrun_command(args, nproc=1)
    result = subprocess.run(
        command,
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
        # torch and the model take ~0.8 GiB; the stem's output alone, 2 GiB more (its
        # allocation fails before any arithmetic)
        preexec_fn=_address_space_of(3 << 30),
    )
    assert result.returncode == EXIT_MEMORY, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "[trainer] error (rank 0, exit 5): out of this node's memory (an allocation of 2.0 GiB "
        "failed) with --batch-size 2 per process, --image-size 4096, --model resnet18"
    ), last
    assert "lower --batch-size (batch_size) or --image-size (image_size)" in last


def test_cuda_out_of_memory_names_the_gpu_and_bf16():
    """CUDA's own error (torch.OutOfMemoryError), as a GPU node raises it."""
    err = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
        "of which 1.23 GiB is free."
    )
    config = SimpleNamespace(batch_size=512, image_size=224, model="vit_b_16", precision="fp32")
    assert is_out_of_memory(err) and not is_out_of_memory(RuntimeError("gloo: timed out"))
    refused = out_of_memory(err, config, torch.device("cuda", 0))
    assert refused.exit_code == EXIT_MEMORY
    assert str(refused) == (
        "out of the GPU's memory (cuda:0) (an allocation of 2.00 GiB failed) with --batch-size "
        "512 per process, --image-size 224, --model vit_b_16, --precision fp32: a process holds "
        "one batch's activations at a time; lower --batch-size (batch_size) or --image-size "
        "(image_size), or train in --precision bf16 (half the activations' memory)"
    )
