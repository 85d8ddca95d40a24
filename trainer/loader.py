"""Streaming a data set that does not fit in memory: DataLoader workers → the training device.

* Workers are started with "spawn" (see :func:`worker_context`) and persist across epochs; their
  number defaults to this process's share of the CPUs the container may use
  (:func:`default_num_workers`), their prefetch depth to what ``/dev/shm`` can hold
  (:func:`prefetch_depth`).
* ``--decode cpu``: a worker decodes with PIL, crops, resizes and flips (uint8, one byte per
  pixel crosses to the device). ``--decode gpu``: a worker only reads the file; the training
  process decodes on the GPU (:mod:`trainer.gpu_decode`).
* On CUDA, :class:`DeviceFeeder` moves each pinned batch to the GPU and prepares it (decode,
  normalise) on a side stream from a background thread, one or two batches ahead of the step
  that uses it, so copies and decoding overlap the training compute.

The batch sampler keys every sample by ``(index, epoch)``; crop windows and flips are drawn from
those (see :mod:`trainer.randomness`), so a run resumed mid-epoch gets the very same batches.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from trainer.data import (
    Batch,
    Normalizer,
    augmented_tensor,
    load_image,
    shard_batches,
)
from trainer.data_worker_loss import watched
from trainer.distributed import available_cpus
from trainer.epoch_size import steps_per_epoch
from trainer.gpu_decode import (
    DecodedJpegs,
    GpuJpegDecoder,
    collate_encoded,
    encoded_sample,
    read_encoded,
)
from trainer.listing import ImageListing
from trainer.randomness import sample_augmentation

MAX_PREFETCH = 4
SHM_SHARE = 0.5
"""Share of /dev/shm the batches in flight of all the machine's training processes may fill."""


# -------------------------------------------------------------------------------------- datasets
class _SampleDataset(torch.utils.data.Dataset):
    """One image per key ``(index, epoch)``; ``epoch`` None: the evaluation resize and crop.

    Holds the compact :class:`ImageListing` (a few arrays), so spawning a worker pickles megabytes
    even for ImageNet.
    """

    def __init__(self, listing: ImageListing, *, image_size: int, augment: str, seed: int):
        self.listing, self.image_size, self.augment, self.seed = listing, image_size, augment, seed

    def __len__(self) -> int:
        return len(self.listing)

    def _augmentation(self, index: int, epoch: int | None, height: int, width: int):
        if epoch is None:
            return None
        return sample_augmentation(self.seed, epoch, index, height, width, self.augment)


class DecodedImages(_SampleDataset):
    """``--decode cpu``: the worker decodes with PIL and returns a uint8 CHW tensor."""

    def __getitem__(self, key: tuple[int, int | None]) -> tuple[torch.Tensor, int]:
        index, epoch = key
        image = load_image(self.listing.path(index))
        augmentation = self._augmentation(index, epoch, image.height, image.width)
        return augmented_tensor(image, augmentation, self.image_size), self.listing.label(index)


class EncodedImages(_SampleDataset):
    """``--decode gpu``: the worker reads the JPEG bytes and draws the crop window."""

    def __getitem__(self, key: tuple[int, int | None]):
        index, epoch = key
        image = read_encoded(self.listing.path(index))
        augmentation = self._augmentation(index, epoch, image.height, image.width)
        return encoded_sample(image, augmentation, self.listing.label(index))


class EpochBatchSampler:
    """Batch sampler over ``(index, epoch)`` keys that can start mid-epoch.

    It lives in the main process, so positioning it works with persistent DataLoader workers.
    """

    def __init__(self, num_items, batch_size, rank, world_size, seed):
        self.args = (num_items, batch_size, rank, world_size, seed)
        self.epoch, self.start = 0, 0

    def set_position(self, epoch: int, start_batch: int) -> None:
        self.epoch, self.start = epoch, start_batch

    def __iter__(self):
        for batch in shard_batches(*self.args, self.epoch)[self.start :]:
            yield [(i, self.epoch) for i in batch]

    def __len__(self) -> int:
        num_items, batch_size, _, world_size, _ = self.args
        return steps_per_epoch(num_items, batch_size, world_size) - self.start


def worker_context():
    """Start DataLoader workers with fork + exec ("spawn"), not a bare fork of this process.

    By the time workers start, this process runs threads (process-group internals, the queue
    feeder threads of other DataLoaders). A bare fork can copy a lock another thread holds and the
    child then blocks forever: seen here as a worker stuck in CPython's after-fork clean-up while
    the trainer waited for its first batch. "forkserver" avoids that too, but its workers outlive
    a SIGKILLed trainer (their parent, the server, stays alive); spawned workers see the trainer
    die. Workers are persistent, so the start-up cost is paid once per run.
    """
    import multiprocessing

    return multiprocessing.get_context("spawn")


# ------------------------------------------------------------------------------ sizing the workers
def default_num_workers(device: torch.device, local_processes: int, cpus: int | None = None) -> int:
    """DataLoader workers per training process when ``--num-workers`` is not given.

    0 on CPU (workers would compete with the compute threads). On CUDA: this process's share of
    the CPUs the container may use (``cpus``; default: the cgroup CPU quota capped by the
    affinity mask, :func:`trainer.distributed.available_cpus`) less one for the training process
    itself, at least 2. No fixed cap: a 16-core share gets 15 workers.
    """
    if device.type != "cuda":
        return 0
    if cpus is None:
        cpus = available_cpus()
    return max(2, cpus // max(1, local_processes) - 1)


def prefetch_depth(
    batch_bytes: int, workers: int, local_processes: int, shm_total: int | None
) -> tuple[int, str | None]:
    """Batches each worker may prepare ahead, and a warning when even one may not fit.

    The rule: every batch a worker has prepared waits in ``/dev/shm`` until the training process
    takes it, so ``local_processes x workers x depth x batch_bytes`` must stay within half of
    ``/dev/shm`` (the other half is slack for the batch being handed over and other users). The
    depth is that quotient, at most 4 (DataLoader's default is 2) and at least 1. A container's
    default 64 MiB ``/dev/shm`` holds under two 224 px batches of 256 images: workers then die
    with "bus error"; mount a memory-backed emptyDir at /dev/shm.
    """
    if shm_total is None or workers == 0:
        return (MAX_PREFETCH if workers else 0), None
    budget = shm_total * SHM_SHARE
    per_round = max(1, local_processes * workers * batch_bytes)
    depth = int(budget // per_round)
    if depth >= 1:
        return min(MAX_PREFETCH, depth), None
    return 1, (
        f"/dev/shm holds {shm_total / 2**20:.0f} MiB, but {local_processes} process(es) x "
        f"{workers} DataLoader workers x one {batch_bytes / 2**20:.1f} MiB batch need "
        f"{per_round / 2**20:.0f} MiB (within half of it): workers may die with 'bus error'. "
        "Mount a bigger /dev/shm (Kubernetes: an emptyDir with medium Memory), or lower "
        "--num-workers or --batch-size"
    )


# ----------------------------------------------------------------------------- host → device
class DeviceFeeder:
    """Host batches → device-ready ``(images, labels)``, through a chain of ``stages``.

    Each stage turns what the previous one made into the next thing (copy to the device, decode,
    crop, normalise); the last one returns ``(images, labels)`` on the device. On CUDA every stage
    runs in its own background thread on its own side stream, up to ``ahead`` batches before the
    training step needs them: host→device copies and GPU decoding overlap the training compute,
    the stages overlap each other (nvJPEG decoding batch k+1 while batch k is cropped), and a
    blocking nvJPEG call never stalls the thread that launches the training kernels. CUDA events
    order the streams batch by batch. On the CPU the stages run inline, nothing read ahead.
    """

    def __init__(
        self, device: torch.device, stages: Sequence[Callable[[Any], Any]], ahead: int = 2
    ):
        if device.type == "cuda" and device.index is None:  # "cuda": the current GPU
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self.stages, self.ahead = device, list(stages), ahead
        self.streams = (
            [torch.cuda.Stream(device) for _ in self.stages] if device.type == "cuda" else None
        )

    def __call__(self, batches: Iterable) -> Iterator[Batch]:
        if self.streams is None:
            for batch in batches:
                for stage in self.stages:
                    batch = stage(batch)
                yield batch
            return
        yield from self._overlapped(batches)

    def _overlapped(self, batches: Iterable) -> Iterator[Batch]:
        stop = threading.Event()
        source: Iterable = ((batch, None) for batch in batches)
        handoffs: list[queue.Queue] = []
        threads = []
        for stage, stream in zip(self.stages, self.streams or [], strict=True):
            handoff: queue.Queue = queue.Queue(maxsize=self.ahead)
            thread = threading.Thread(
                target=self._run_stage,
                args=(stage, stream, source, handoff, stop),
                name="device-feeder",
                daemon=True,
            )
            handoffs.append(handoff)
            threads.append(thread)
            source = _received(handoff, stop)
        for thread in threads:
            thread.start()
        current = torch.cuda.current_stream(self.device)
        try:
            for tensors, event in source:
                current.wait_event(event)
                # The caching allocator must not hand this memory to a side stream again while
                # the training stream still reads it.
                _record_stream(tensors, current)
                yield tensors
        finally:
            stop.set()
            while any(thread.is_alive() for thread in threads):  # unblock waiting producers
                for handoff in handoffs:
                    with contextlib.suppress(queue.Empty):
                        handoff.get_nowait()
                time.sleep(0.01)

    def _run_stage(self, stage, stream, source, handoff: queue.Queue, stop) -> None:
        item: Any = None
        try:
            torch.cuda.set_device(self.device)
            with torch.cuda.stream(stream):
                for payload, ready in source:
                    if stop.is_set():
                        return
                    if ready is not None:
                        stream.wait_event(ready)
                        _record_stream(payload, stream)
                    result = stage(payload)
                    done = torch.cuda.Event()
                    done.record(stream)
                    if not _put(handoff, (result, done), stop):
                        return
        except BaseException as err:  # handed on to the consumer, which raises it
            item = err
        _put(handoff, item, stop)


def _received(handoff: queue.Queue, stop: threading.Event) -> Iterator:
    """What a stage handed on, until its end marker; its exception is raised here."""
    while not stop.is_set():
        try:
            item = handoff.get(timeout=0.05)
        except queue.Empty:
            continue
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def _record_stream(value: Any, stream) -> None:
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, list | tuple):
        for element in value:
            _record_stream(element, stream)


def _put(handoff: queue.Queue, item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        with contextlib.suppress(queue.Full):
            handoff.put(item, timeout=0.05)
            return True
    return False


# ------------------------------------------------------------------------------------ the source
class StreamedImages:
    """A data set read from files by DataLoader workers, one epoch at a time."""

    def __init__(
        self,
        train: ImageListing,
        val: ImageListing,
        *,
        image_size: int,
        augment: str,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        num_workers: int,
        normalize: Normalizer,
        val_batch_size: int | None = None,
        decode: str = "cpu",
        prefetch_factor: int | None = None,
    ):
        device = normalize.device
        self.decode = decode
        self.val_batch_size = val_batch_size or 2 * batch_size
        self.sampler = EpochBatchSampler(len(train), batch_size, rank, world_size, seed)
        sample_options: dict[str, Any] = dict(image_size=image_size, augment=augment, seed=seed)
        source = EncodedImages if decode == "gpu" else DecodedImages
        options: dict[str, Any] = {"num_workers": num_workers, "pin_memory": device.type == "cuda"}
        if decode == "gpu":
            options["collate_fn"] = collate_encoded
        if num_workers > 0:
            options.update(
                persistent_workers=True,
                prefetch_factor=prefetch_factor or 2,
                multiprocessing_context=worker_context(),
            )
        self.train_loader = torch.utils.data.DataLoader(
            source(train, **sample_options), batch_sampler=self.sampler, **options
        )
        val_keys = [(i, None) for i in range(rank, len(val), world_size)]
        # Persistent too: validation every epoch must not start (and import in) new workers.
        self.val_loader = (
            torch.utils.data.DataLoader(
                source(val, **sample_options),
                batch_size=self.val_batch_size,
                sampler=val_keys,
                **options,
            )
            if val_keys
            else None
        )
        self.normalize = normalize
        self.steps_per_epoch = steps_per_epoch(len(train), batch_size, world_size)
        finish = _Finish(normalize)
        stages: list[Callable[[Any], Any]]
        if decode == "gpu":
            decoder = GpuJpegDecoder(device, image_size)
            stages = [decoder.decode, _Cropped(decoder, finish)]
        else:
            stages = [finish]
        self.feed = DeviceFeeder(device, stages)

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        self.sampler.set_position(epoch, start_batch)
        return self.feed(watched(self.train_loader))

    def validation(self, batch_size: int) -> Iterator[Batch]:
        """This rank's validation shard (batch size fixed at construction: ``val_batch_size``)."""
        if self.val_loader is None:
            return iter(())
        return self.feed(watched(self.val_loader))


class _Finish:
    """Last stage: uint8 images and labels → normalised images and labels on the device."""

    def __init__(self, normalize: Normalizer):
        self.normalize = normalize

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Batch:
        images, labels = batch
        return self.normalize(images), labels.to(self.normalize.device, non_blocking=True)


class _Cropped:
    """Second stage of ``--decode gpu``: crop, resize and flip the decoded images, then finish."""

    def __init__(self, decoder: GpuJpegDecoder, finish: _Finish):
        self.decoder, self.finish = decoder, finish

    def __call__(self, decoded: DecodedJpegs) -> Batch:
        return self.finish((self.decoder.crop(decoded), decoded.labels))
