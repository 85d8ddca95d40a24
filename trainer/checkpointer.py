"""The checkpointer: rank 0 copies the training state to host memory, then writes it in a thread.

Training stops only for the copy (into pinned buffers on CUDA, reused from save to save); the
bytes go to disk (``step-N/``, see :mod:`trainer.checkpoint`) while the next steps run. At most one
write is in flight: the next save first waits for the previous one. A failed write is kept and
reported on the training thread (:meth:`Checkpointer.failed` feeds the loop's all-ranks check),
never lost. Pruning to the newest K runs after a write has completed. ``on_written`` (if set) is
told of each complete folder on the writer thread, right after its write: the S3 mirror
(:mod:`trainer.s3_mirror`) queues its upload there.

Why not ``torch.distributed.checkpoint.async_save``: it writes a folder of shards plus metadata,
not one ``state.pt`` that ``torch.load(weights_only=True)`` reads, and it expects every rank to
take part; a DDP replica's state is whole on rank 0, whose bytes are broadcast on resume.
"""

from __future__ import annotations

import errno
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer import checkpoint as ckpt
from trainer.errors import StorageError
from trainer.run_log import RunLog

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass(kw_only=True)
class _Write:
    """One checkpoint handed to the writer thread."""

    step: int
    reason: str
    state: dict[str, Any]
    """Host copies only: the training thread never touches them again."""
    nbytes: int
    """Tensor bytes in ``state`` (about the size of state.pt)."""
    copied: torch.cuda.Event | None = None
    """Recorded after the device-to-host copies; the writer waits on it."""
    snapshot_s: float = 0.0
    saved_at: float = 0.0
    """``time.monotonic()`` when :meth:`Checkpointer.save` was called."""


@dataclass(frozen=True, kw_only=True)
class _Written:
    folder: Path
    write_s: float


class Checkpointer:
    """Saves step checkpoints on rank 0; every rank calls the same methods at the same steps.

    ``background=False`` writes on the calling thread (the blocking writer, for comparison).
    """

    def __init__(
        self,
        root: Path,
        *,
        keep: int,
        is_writer: bool,
        log: RunLog,
        device: torch.device = torch.device("cpu"),
        background: bool = True,
    ):
        self.root, self.keep, self.is_writer, self.log = Path(root), keep, is_writer, log
        self.background = background
        self._copies = _HostCopies(pinned=device.type == "cuda")
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: tuple[_Write, Future] | None = None
        self.failure: StorageError | None = None
        """The first write that failed (rank 0); no checkpoint is written after it."""
        self.last_write_s: float | None = None
        """Seconds the newest completed write took (set on the writer thread; for metrics)."""
        self.on_written: Callable[[int, Path, float], None] | None = None
        """Called on the writer thread with (step, folder, saved_at) after each complete write;
        must not block (saved_at: ``time.monotonic()`` at :meth:`save`)."""

    def save(self, step: int, state: Callable[[], dict[str, Any]], reason: str) -> None:
        """Snapshot ``state()`` to host memory and write it as ``step-{step}`` (rank 0)."""
        if not self.is_writer:
            return
        saved_at = time.monotonic()
        self.wait()  # at most one write in flight; its buffers are reused below
        if self.failure is not None:
            return  # reported by failed() at the loop's next all-ranks check
        if not self.background:  # torch.save of the live state, on this thread
            live = state()
            job = _Write(
                step=step,
                reason=reason,
                state=live,
                nbytes=tensor_bytes(live),
                saved_at=saved_at,
            )
            future: Future = Future()
            try:
                future.set_result(self._write(job))
            except StorageError as err:
                future.set_exception(err)
            self._in_flight = (job, future)
            self.wait()
            return
        began = time.perf_counter()
        snapshot, nbytes = self._copies.copy(state())
        copied = None
        if self._copies.pinned:
            copied = torch.cuda.Event()
            copied.record()
        job = _Write(
            step=step,
            reason=reason,
            state=snapshot,
            nbytes=nbytes,
            copied=copied,
            snapshot_s=time.perf_counter() - began,
            saved_at=saved_at,
        )
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._in_flight = (job, self._pool.submit(self._write, job))

    @property
    def writing(self) -> bool:
        """Whether a write is still going on in the background."""
        return self._in_flight is not None and not self._in_flight[1].done()

    def failed(self) -> bool:
        """Whether a write has failed (without waiting for one in flight)."""
        if self._in_flight is not None and self._in_flight[1].done():
            self._collect()
        return self.failure is not None

    def wait(self) -> None:
        """Block until no write is in flight (its failure, if any, lands in ``failure``)."""
        if self._in_flight is not None:
            self._collect()

    def close(self) -> None:
        """Wait for the write in flight and stop the writer thread."""
        self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # ----------------------------------------------------------------------------- internals
    def _collect(self) -> None:
        assert self._in_flight is not None
        job, future = self._in_flight
        self._in_flight = None
        try:
            written: _Written = future.result()
        except StorageError as err:
            self.failure = err
            return
        how = (
            f"training paused {job.snapshot_s:.2f}s for the copy, written in {written.write_s:.2f}s"
            if self.background
            else f"written in {written.write_s:.2f}s while training waited"
        )
        self.log.line(f"checkpoint {written.folder} ({job.reason}; {how})")

    def _write(self, job: _Write) -> _Written:
        """The writer thread's task: wait for the copies, write, prune."""
        if job.copied is not None:
            job.copied.synchronize()
        began = time.perf_counter()
        try:
            folder = ckpt.save_checkpoint(self.root, job.step, job.state, keep=self.keep)
        except Exception as err:
            raise checkpoint_write_failure(self.root, job.step, job.nbytes, self.keep, err) from err
        written = _Written(folder=folder, write_s=time.perf_counter() - began)
        self.last_write_s = written.write_s
        if self.on_written is not None:
            self.on_written(job.step, folder, job.saved_at)
        return written


class _HostCopies:
    """Copies a state tree's tensors to host memory (pinned buffers reused on CUDA)."""

    def __init__(self, *, pinned: bool):
        self.pinned = pinned
        self._buffers: dict[str, torch.Tensor] = {}

    def copy(self, tree: Any) -> tuple[Any, int]:
        """A copy of ``tree`` whose tensors the training thread will not change; tensor bytes."""
        self._nbytes = 0
        return self._copy(tree, ""), self._nbytes

    def _copy(self, node: Any, key: str) -> Any:
        if isinstance(node, torch.Tensor):
            self._nbytes += node.numel() * node.element_size()
            return self._tensor(node.detach(), key)
        if isinstance(node, dict):
            return {k: self._copy(v, f"{key}/{k}") for k, v in node.items()}
        if isinstance(node, list | tuple):
            items = [self._copy(v, f"{key}/{i}") for i, v in enumerate(node)]
            return items if isinstance(node, list) else tuple(items)
        return node  # ints, floats, strings, None: immutable

    def _tensor(self, tensor: torch.Tensor, key: str) -> torch.Tensor:
        if not (self.pinned and tensor.is_cuda):
            return tensor.to("cpu", copy=True)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._buffers[key] = buffer
        # Ordered on the current stream: later steps' updates cannot overtake the copy.
        return buffer.copy_(tensor, non_blocking=True)


def tensor_bytes(tree: Any) -> int:
    """Bytes of the tensors in a state tree."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(tensor_bytes(v) for v in tree)
    return 0


# ------------------------------------------------------------------------ failures, explained
def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or of its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def is_no_space(err: BaseException, needed: int, free: int | None) -> bool:
    """Whether ``err`` means a full disk or quota.

    ``torch.save`` reports a full disk as ``RuntimeError: [enforce fail at inline_container.cc]
    unexpected pos …`` without an errno, so the free space decides when the errno cannot.
    """
    chain: BaseException | None = err
    while chain is not None:
        if isinstance(chain, OSError) and chain.errno in _NO_SPACE:
            return True
        chain = chain.__cause__ or chain.__context__
    return free is not None and free < needed


def checkpoint_write_failure(
    root: Path, step: int, needed: int, keep: int, err: BaseException
) -> StorageError:
    """A StorageError that names the folder, the bytes needed and free, and the fix."""
    free = free_bytes(root)
    latest = ckpt.latest_complete_checkpoint(root)
    kept = (
        f"The newest complete checkpoint, {latest.name}, is intact: rerun after the fix to "
        f"resume from it."
        if latest is not None
        else "No complete checkpoint exists yet."
    )
    if is_no_space(err, needed, free):
        return StorageError(
            f"checkpoint step-{step} could not be written to {root}: no space left on its file "
            f"system ({mib(needed)} needed for one checkpoint, "
            f"{mib(free) if free is not None else 'an unknown amount'} free). {kept} Fix: free "
            f"space there or give --checkpoint-dir a larger volume (--keep-checkpoints {keep} "
            f"needs room for {keep + 1} checkpoints, about {mib(needed * (keep + 1))})."
        )
    return StorageError(
        f"checkpoint step-{step} could not be written to {root}: {type(err).__name__}: {err}. "
        f"{kept} Fix: make {root} writable (or point --checkpoint-dir elsewhere)."
    )
