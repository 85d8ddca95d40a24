"""The input pipeline of an ImageFolder run, chosen from the config: the one place it is built.

1. Rank 0 lists the folder and broadcasts the listing (:func:`trainer.listing.shared_splits`).
2. A data set that fits in 512 MiB decoded (``--cache-images auto``) is decoded once into device
   memory (:class:`trainer.data.CachedImages`); ``--decode`` does not apply to it.
3. Otherwise DataLoader workers stream it (:class:`trainer.loader.StreamedImages`), decoding on
   the CPU or, with ``--decode gpu``, on the GPU. ``--decode auto`` is ``gpu`` when the training
   device is a CUDA GPU whose torchvision decodes a probe JPEG, else ``cpu``: on an H100 the
   workers' CPU decode (~2.5 ms per ImageNet image per core) cannot keep up, and baseline JPEGs
   decode on the GPU's hardware JPEG engines without taking SM time.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.config import TrainConfig
from trainer.data import (
    CACHE_LIMIT_BYTES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    CachedImages,
    Normalizer,
    estimated_cache_bytes,
)
from trainer.distributed import DistEnv, available_cpus, processes_on_this_machine
from trainer.errors import ConfigError
from trainer.gpu_decode import gpu_decode_problem
from trainer.image_check import (
    CHECK_THREADS_MAX,
    SHOWN,
    BadImage,
    bad_images_error,
    find_bad_images,
    gathered,
    without,
)
from trainer.listing import ImageListing, broadcast_bytes, shared_splits
from trainer.loader import StreamedImages, default_num_workers, prefetch_depth
from trainer.mirror_probe import MirrorProbe, probe_mirror
from trainer.shared_memory import shm_bytes

SIZE_SAMPLE = 64
"""Files whose sizes estimate a batch of encoded JPEGs (``--decode gpu``)."""


@dataclass(frozen=True, kw_only=True)
class FolderData:
    """This rank's batches of an ImageFolder and what the run log should say about them."""

    data: CachedImages | StreamedImages
    class_names: list[str]
    description: str
    """One line for the run log: sizes, classes, and how the images reach the device."""
    warnings: list[str] = field(default_factory=list)
    skipped: list[BadImage] = field(default_factory=list)
    """The unreadable images left out (``--skip-bad-images``)."""
    mirror: MirrorProbe | None = None
    """``--augment auto``'s probe: whether the training images are mirrored, and why."""


def _augmentation(
    setting: str, train: ImageListing, env: DistEnv, group
) -> tuple[str, MirrorProbe | None]:
    """``--augment`` as the loaders take it: ``auto`` decided by rank 0's mirror probe (every
    rank gets its answer), anything else as it is."""
    if setting != "auto":
        return setting, None
    probe = probe_mirror(train) if env.is_main else None
    if env.distributed:
        blob = json.dumps(dataclasses.asdict(probe)).encode() if probe else b""
        probe = MirrorProbe(**json.loads(broadcast_bytes(blob, group=group, is_source=env.is_main)))
    assert probe is not None
    return probe.augment(), probe


def resolve_decode(setting: str, device: torch.device) -> tuple[str, str | None]:
    """``--decode`` → ``cpu`` or ``gpu``, and why ``auto`` could not pick the GPU (if so)."""
    if setting == "cpu":
        return "cpu", None
    problem = gpu_decode_problem(device)
    if problem is None:
        return "gpu", None
    if setting == "gpu":
        raise ConfigError(f"--decode gpu cannot work here: {problem}; use --decode cpu or auto")
    return "cpu", (None if device.type != "cuda" else f"--decode auto chose cpu: {problem}")


def build_folder_data(cfg: TrainConfig, env: DistEnv, device: torch.device, group) -> FolderData:
    """This rank's train/val batches of ``cfg.data_dir`` (raises DataError for bad data)."""
    assert cfg.data_dir is not None, "a --synthetic run builds no folder data"
    splits = shared_splits(
        cfg.data_dir,
        val_fraction=cfg.val_fraction,
        seed=cfg.seed,
        group=group,
        is_main=env.is_main,
    )
    train, val, skipped = _readable(cfg, env, group, splits.train, splits.val)
    augment, probe = _augmentation(cfg.augment, train, env, group)
    normalize = Normalizer(IMAGENET_MEAN, IMAGENET_STD, device, bool(cfg.channels_last))
    common: dict[str, Any] = dict(
        image_size=cfg.image_size,
        augment=augment,
        batch_size=cfg.batch_size,
        rank=env.rank,
        world_size=env.world_size,
        seed=cfg.seed,
        normalize=normalize,
    )
    sizes = f"{len(train)} train / {len(val)} val images, {len(splits.class_names)} classes"
    size = estimated_cache_bytes(len(train) + len(val), cfg.image_size)
    if cfg.cache_images == "always" or (cfg.cache_images == "auto" and size <= CACHE_LIMIT_BYTES):
        data: CachedImages | StreamedImages = CachedImages(train, val, **common)
        return FolderData(
            data=data,
            class_names=splits.class_names,
            description=f"{sizes}, cached in memory",
            warnings=_skipped_warning(skipped),
            skipped=skipped,
            mirror=probe,
        )

    decode, decode_note = resolve_decode(cfg.decode, device)
    local = processes_on_this_machine(env)
    workers = cfg.num_workers
    if workers is None:
        workers = default_num_workers(device, local)
    val_batch = cfg.val_batch_size or 2 * cfg.batch_size
    image_bytes = (
        _encoded_image_bytes(train) if decode == "gpu" else 3 * cfg.image_size * cfg.image_size
    )
    prefetch, shm_warning = prefetch_depth(
        max(cfg.batch_size, val_batch) * image_bytes, workers, local, shm_bytes()
    )
    data = StreamedImages(
        train,
        val,
        num_workers=workers,
        val_batch_size=cfg.val_batch_size,
        decode=decode,
        prefetch_factor=prefetch or None,
        **common,
    )
    return FolderData(
        data=data,
        class_names=splits.class_names,
        description=(
            f"{sizes}, streamed from files (decode on {decode}, {workers} workers per process, "
            f"prefetch {prefetch} batches each)"
        ),
        warnings=[note for note in (decode_note, shm_warning) if note] + _skipped_warning(skipped),
        skipped=skipped,
        mirror=probe,
    )


def _readable(
    cfg: TrainConfig, env: DistEnv, group, train: ImageListing, val: ImageListing
) -> tuple[ImageListing, ImageListing, list[BadImage]]:
    """``train`` and ``val`` once every image was read (:mod:`trainer.image_check`): unchanged,
    less the unreadable ones (``--skip-bad-images``), or a DataError listing all of those."""
    assert cfg.data_dir is not None
    data_dir = Path(cfg.data_dir)
    threads = min(CHECK_THREADS_MAX, max(1, available_cpus() // processes_on_this_machine(env)))
    mine = find_bad_images(
        (train, val), data_dir, rank=env.rank, world_size=env.world_size, threads=threads
    )
    bad = gathered(mine, group)
    if not bad:
        return train, val, []
    if not cfg.skip_bad_images:
        raise bad_images_error(bad, len(train) + len(val))
    return without(train, bad, data_dir), without(val, bad, data_dir), bad


def _skipped_warning(skipped: list[BadImage]) -> list[str]:
    if not skipped:
        return []
    shown = ", ".join(b.key for b in skipped[:SHOWN])
    more = f" and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else ""
    return [
        f"--skip-bad-images: {len(skipped)} unreadable images left out (see summary.json): "
        f"{shown}{more}"
    ]


def _encoded_image_bytes(listing: ImageListing) -> int:
    """Mean file size of up to 64 evenly spaced images, with 50 % slack (JPEG sizes vary)."""
    count = len(listing)
    picks = range(0, count, max(1, count // SIZE_SAMPLE))
    sizes = []
    for index in picks:
        try:
            sizes.append(os.stat(Path(listing.path(index))).st_size)
        except OSError:  # reported by the worker that reads it, with its path
            continue
    return int(1.5 * sum(sizes) / len(sizes)) if sizes else 3 * 2**20
