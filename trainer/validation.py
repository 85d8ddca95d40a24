"""Checks of the model while and after it trains: validation accuracy, replicas in sync."""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer.build import Precision
from trainer.distributed import DistEnv
from trainer.run_log import RunLog


class Validator:
    """Loss and accuracy on the validation split, summed over every rank's shard."""

    def __init__(
        self, data, *, env: DistEnv, device: torch.device, precision: Precision, batch_size: int
    ):
        self.data, self.env, self.device = data, env, device
        self.precision, self.batch_size = precision, batch_size

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module) -> tuple[float | None, float | None]:
        """``(loss, accuracy)``, or ``(None, None)`` without validation images."""
        self._sync_buffers(model)
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        for images, labels in self.data.validation(self.batch_size):
            with self.precision.autocast(self.device):
                logits = model(images)
            totals[0] += F.cross_entropy(logits.float(), labels, reduction="sum")
            totals[1] += (logits.argmax(1) == labels).sum()
            totals[2] += labels.numel()
        if self.env.distributed:
            dist.all_reduce(totals)
        model.train()
        loss_sum, correct, count = totals.tolist()
        if count == 0:
            return None, None
        return loss_sum / count, correct / count

    def _sync_buffers(self, model: torch.nn.Module) -> None:
        """Give every rank rank 0's BatchNorm statistics (each forward updates only its own)."""
        if self.env.distributed:
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer, bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def replicas_in_sync(model: torch.nn.Module, env: DistEnv, group, log: RunLog) -> bool:
    """Compare every rank's parameters and buffers bit for bit (sha256 over the state)."""
    if not env.distributed:
        return True
    digests: list[str | None] = [None] * env.world_size
    dist.all_gather_object(digests, weights_digest(model), group=group)
    in_sync = len(set(digests)) == 1
    if not in_sync:
        log.line(f"WARNING: replicas diverged; weight digests per rank: {digests}")
    return in_sync
