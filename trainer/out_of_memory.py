"""Out of memory, said in one line: the settings that decide the memory a process needs, and what
to lower, instead of torch's traceback.

A process runs out of memory when a batch's activations do not fit: CUDA's allocator raises
``torch.OutOfMemoryError`` ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total
capacity of ..."), the CPU's a plain RuntimeError ("DefaultCPUAllocator: can't allocate memory:
you tried to allocate 1073741824 bytes"). Either used to end the process with exit 1 and a
traceback of the model's layers. It is permanent: a restart with the same batch size and image
size needs the same memory, so :class:`~trainer.errors.OutOfMemory` exits 5 (below 128: the
Training Operator does not restart the job, the pod's last line says why).
"""

from __future__ import annotations

import re
from typing import Any

from trainer.errors import OutOfMemory

CPU_ALLOCATOR_FAILED = "can't allocate memory"
"""The CPU allocator's words (c10's DefaultCPUAllocator) when the system refuses an allocation."""
_ASKED = re.compile(r"[Tt]ried to allocate (\d+ bytes|[\d.]+ [KMGT]iB)")
_GIB = 1 << 30


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation torch could not get, on a GPU or on the CPU."""
    import torch

    return isinstance(err, torch.OutOfMemoryError) or CPU_ALLOCATOR_FAILED in str(err)


def out_of_memory(err: BaseException, config: Any, device: Any) -> OutOfMemory:
    """The one-line error for ``err`` (``is_out_of_memory``) in a run of ``config`` on
    ``device`` (a ``torch.device``)."""
    on_gpu = getattr(device, "type", "cpu") == "cuda"
    where = f"the GPU's memory ({device})" if on_gpu else "this node's memory"
    settings = (
        f"--batch-size {config.batch_size} per process, --image-size {config.image_size}, "
        f"--model {config.model}, --precision {config.precision}"
    )
    fixes = ["lower --batch-size (batch_size) or --image-size (image_size)"]
    if config.precision == "fp32" and on_gpu:
        fixes.append("train in --precision bf16 (half the activations' memory)")
    if not on_gpu:
        fixes.append("give each node more memory (memory_request) or fewer processes")
    return OutOfMemory(
        f"out of {where}{_asked(str(err))} with {settings}: a process holds one batch's "
        f"activations at a time; {', or '.join(fixes)}"
    )


def _asked(text: str) -> str:
    """' (an allocation of 1.0 GiB failed)' from torch's message, or ''."""
    found = _ASKED.search(text)
    if found is None:
        return ""
    amount = found.group(1)
    if amount.endswith(" bytes"):
        amount = f"{int(amount.split()[0]) / _GIB:.1f} GiB"
    return f" (an allocation of {amount} failed)"
