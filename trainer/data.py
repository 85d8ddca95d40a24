"""Input data: ImageFolder-style folders decoded with PIL, or synthetic tensors on the device.

Public helpers other parts import: :func:`list_images`, :func:`load_image`, :func:`eval_transform`.

Randomness is a pure function of ``(seed, epoch, position)``: the DistributedSampler order depends
on ``(seed, epoch)`` only, per-sample augmentation of streamed images is seeded with
``(seed, epoch, index)`` and batch augmentation of cached images with ``(seed, epoch, batch,
rank)``. A resumed run therefore replays exactly the batches an uninterrupted run would have seen,
without saving any generator state.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from trainer.errors import DataError
from trainer.tv_compat import import_torchvision

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Decoded data sets up to this size are kept in memory (on the training device) as uint8.
CACHE_LIMIT_BYTES = 512 * 2**20

Batch = tuple[torch.Tensor, torch.Tensor]


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


# --------------------------------------------------------------------------------- public helpers
def list_images(
    split_dir: Path, class_names: list[str] | None = None
) -> tuple[list[tuple[Path, int]], list[str]]:
    """Sorted ``(path, label)`` pairs of ``split_dir/<class>/*`` and the class names.

    With ``class_names`` (e.g. the training classes when listing ``val/``) labels follow that list
    and a class folder outside it is an error; a class may be missing. Raises :class:`DataError`
    naming the folder when there is no class folder, an empty class folder, or an unknown class.
    """
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise DataError(f"data folder {split_dir} does not exist; expected {split_dir}/<class>/*")
    folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataError(
            f"no class folders in {split_dir}; expected one sub-folder of images per class"
        )
    names = [p.name for p in folders] if class_names is None else list(class_names)
    label_of = {name: i for i, name in enumerate(names)}
    items: list[tuple[Path, int]] = []
    for folder in folders:
        if folder.name not in label_of:
            raise DataError(
                f"class folder {folder} is not one of the training classes {names}; "
                "remove it or add the class to the training data"
            )
        files = sorted(
            p
            for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not files:
            raise DataError(
                f"class folder {folder} has no images ({', '.join(IMAGE_EXTENSIONS)}); "
                "add images or remove the folder"
            )
        items.extend((path, label_of[folder.name]) for path in files)
    return items, names


def load_image(path: Path | str) -> Image.Image:
    """Decode ``path`` with PIL as RGB; :class:`DataError` naming the file if it is unreadable."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(f"cannot read image {path}: {err}; fix or delete the file") from err


def eval_transform(
    image_size: int, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> Callable[[Image.Image], torch.Tensor]:
    """PIL image → normalised float CHW tensor: resize the shorter side, centre crop, normalise."""
    v2 = _v2()
    return v2.Compose(
        [
            _resize_crop(image_size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(mean), list(std)),
        ]
    )


def split_train_val(
    items: list[tuple[Path, int]], fraction: float, seed: int
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """Seeded, per-class split of ``items`` into train and validation (at least one of each)."""
    by_class: dict[int, list[tuple[Path, int]]] = {}
    for item in items:
        by_class.setdefault(item[1], []).append(item)
    rng = random.Random(derive_seed(seed, "val-split"))
    train, val = [], []
    for label in sorted(by_class):
        members = list(by_class[label])
        rng.shuffle(members)
        n_val = min(len(members) - 1, max(1, round(len(members) * fraction)))
        val.extend(members[:n_val])
        train.extend(members[n_val:])
    return sorted(train), sorted(val)


# ----------------------------------------------------------------------------------- transforms
def _v2():
    import_torchvision()
    from torchvision.transforms import v2

    return v2


def _resize_crop(image_size: int):
    """PIL → uint8 CHW tensor at ``image_size``², exactly like the evaluation preprocessing."""
    v2 = _v2()
    return v2.Compose(
        [
            v2.PILToTensor(),
            v2.Resize(image_size, antialias=True),
            v2.CenterCrop(image_size),
        ]
    )


def _stream_train_transform(image_size: int, augment: str):
    v2 = _v2()
    if augment == "none":
        return _resize_crop(image_size)
    steps = [v2.PILToTensor(), v2.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True)]
    if augment == "crop-flip":
        steps.append(v2.RandomHorizontalFlip())
    return v2.Compose(steps)


class Normalizer:
    """uint8 NCHW batch (any device) → normalised float32 batch on ``device``.

    Converting on the device keeps host→device copies at one byte per pixel.
    """

    def __init__(self, mean, std, device: torch.device, channels_last: bool):
        self.device = device
        self.scale = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255.0
        self.shift = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255.0
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device, non_blocking=True).float()
        x = x.sub_(self.shift).div_(self.scale)
        return x.contiguous(memory_format=self.memory_format)


def _crop_flip_batch(
    images: torch.Tensor, pad: int, flip: bool, generator: torch.Generator
) -> torch.Tensor:
    """Random pad-and-crop (CIFAR-style) and horizontal flip of a uint8 batch, in one gather."""
    n, _, h, w = images.shape
    dev = images.device
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad)) if pad else images
    oy = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator, device=dev)
    ox = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator, device=dev)
    rows = oy + torch.arange(h, device=dev)
    cols = ox + torch.arange(w, device=dev)
    if flip:
        mirrored = torch.rand(n, 1, generator=generator, device=dev) < 0.5
        cols = torch.where(mirrored, cols.flip(1), cols)
    batch_index = torch.arange(n, device=dev).view(n, 1, 1)
    # Advanced indices separated by a slice put the index dims first: (n, h, w, c).
    out = padded[batch_index, :, rows.view(n, h, 1), cols.view(n, 1, w)]
    return out.permute(0, 3, 1, 2)


# --------------------------------------------------------------------------------- data sources
@dataclass(frozen=True)
class DataSpec:
    """What the training loop needs to know about the data set."""

    class_names: list[str]
    num_train: int
    num_val: int
    cached: bool
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD


def _shard_batches(
    num_items: int, batch_size: int, rank: int, world_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """This rank's full batches of one epoch (DistributedSampler order, last partial dropped)."""
    sampler = torch.utils.data.DistributedSampler(
        range(num_items), num_replicas=world_size, rank=rank, shuffle=True, seed=seed
    )
    sampler.set_epoch(epoch)
    order = list(sampler)
    return [order[i : i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]


def steps_per_epoch(num_items: int, batch_size: int, world_size: int) -> int:
    """Full per-rank batches in one epoch (identical on every rank)."""
    return math.ceil(num_items / world_size) // batch_size


class CachedImages:
    """A small data set decoded once into a uint8 tensor on the device; augmentation per batch."""

    def __init__(
        self,
        train: list[tuple[Path, int]],
        val: list[tuple[Path, int]],
        *,
        image_size: int,
        augment: str,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        normalize: Normalizer,
    ):
        device = normalize.device
        self.train_x, self.train_y = _decode_all(train, image_size, device)
        self.val_x, self.val_y = _decode_all(val, image_size, device)
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        self.pad = max(1, image_size // 8) if augment != "none" else 0
        self.flip = augment == "crop-flip"
        self.normalize = normalize
        self.steps_per_epoch = steps_per_epoch(len(train), batch_size, world_size)

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        batches = _shard_batches(
            len(self.train_y), self.batch_size, self.rank, self.world_size, self.seed, epoch
        )
        device = self.train_x.device
        # One host→device copy per epoch; a per-step copy of pageable memory would sync the GPU.
        order = torch.tensor(batches, dtype=torch.long).to(device, non_blocking=True)
        for position in range(start_batch, len(batches)):
            index = order[position]
            images = self.train_x.index_select(0, index)
            if self.pad or self.flip:
                generator = torch.Generator(device=device)
                generator.manual_seed(derive_seed(self.seed, "aug", epoch, position, self.rank))
                images = _crop_flip_batch(images, self.pad, self.flip, generator)
            yield self.normalize(images), self.train_y.index_select(0, index)

    def validation(self, batch_size: int) -> Iterator[Batch]:
        shard = torch.arange(self.rank, len(self.val_y), self.world_size, device=self.val_y.device)
        for chunk in shard.split(batch_size):
            images = self.val_x.index_select(0, chunk)
            yield self.normalize(images), self.val_y.index_select(0, chunk)


def _decode_all(
    items: list[tuple[Path, int]], image_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    to_tensor = _resize_crop(image_size)

    def decode(item: tuple[Path, int]) -> torch.Tensor:
        return to_tensor(load_image(item[0]))

    # PIL releases the GIL while decoding, so threads overlap file reads and decodes.
    threads = max(1, min(8, torch.get_num_threads() * 2))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        tensors = list(pool.map(decode, items))
    if not tensors:
        empty = torch.empty(0, 3, image_size, image_size, dtype=torch.uint8, device=device)
        return empty, torch.empty(0, dtype=torch.long, device=device)
    images = torch.stack(tensors).to(device)
    labels = torch.tensor([label for _, label in items], dtype=torch.long, device=device)
    return images, labels


class _FileDataset(torch.utils.data.Dataset):
    """Decodes one file per item; keys are ``(index, epoch)`` so augmentation can be seeded.

    The transform is built lazily from ``make_transform`` (a picklable module-level callable), so
    a spawned worker imports torchvision through :mod:`trainer.tv_compat`.
    """

    def __init__(self, items: list[tuple[Path, int]], make_transform, seed: int):
        self.items, self.make_transform, self.seed = items, make_transform, seed
        self._transform = None

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_transform": None}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: tuple[int, int | None]) -> tuple[torch.Tensor, int]:
        index, epoch = key
        path, label = self.items[index]
        if self._transform is None:
            self._transform = self.make_transform()
        if epoch is not None:
            # Seeds this worker's generator (or the main process's with num_workers=0, which the
            # training step reseeds anyway) so the sample's augmentation is a function of its key.
            torch.manual_seed(derive_seed(self.seed, "sample", epoch, index))
        return self._transform(load_image(path)), label


class _EpochBatchSampler:
    """Batch sampler over ``(index, epoch)`` keys that can start mid-epoch.

    It lives in the main process, so positioning it works with persistent DataLoader workers.
    """

    def __init__(self, num_items, batch_size, rank, world_size, seed):
        self.args = (num_items, batch_size, rank, world_size, seed)
        self.epoch, self.start = 0, 0

    def set_position(self, epoch: int, start_batch: int) -> None:
        self.epoch, self.start = epoch, start_batch

    def __iter__(self):
        for batch in _shard_batches(*self.args, self.epoch)[self.start :]:
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


class StreamedImages:
    """A data set read from files by DataLoader workers, one epoch at a time."""

    def __init__(
        self,
        train: list[tuple[Path, int]],
        val: list[tuple[Path, int]],
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
    ):
        pin = normalize.device.type == "cuda"
        options: dict = {"num_workers": num_workers, "pin_memory": pin}
        if num_workers > 0:
            options.update(
                persistent_workers=True, prefetch_factor=4, multiprocessing_context=worker_context()
            )
        self.sampler = _EpochBatchSampler(len(train), batch_size, rank, world_size, seed)
        self.train_loader = torch.utils.data.DataLoader(
            _FileDataset(
                train, functools.partial(_stream_train_transform, image_size, augment), seed
            ),
            batch_sampler=self.sampler,
            **options,
        )
        val_keys = [(i, None) for i in range(rank, len(val), world_size)]
        self.val_batch_size = val_batch_size or 2 * batch_size
        # Persistent too: validation every epoch must not start (and import in) new workers.
        self.val_loader = (
            torch.utils.data.DataLoader(
                _FileDataset(val, functools.partial(_resize_crop, image_size), seed),
                batch_size=self.val_batch_size,
                sampler=val_keys,
                **options,
            )
            if val_keys
            else None
        )
        self.normalize = normalize
        self.steps_per_epoch = steps_per_epoch(len(train), batch_size, world_size)

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        self.sampler.set_position(epoch, start_batch)
        for images, labels in self.train_loader:
            yield self.normalize(images), labels.to(self.normalize.device, non_blocking=True)

    def validation(self, batch_size: int) -> Iterator[Batch]:
        """This rank's validation shard (batch size fixed at construction: ``val_batch_size``)."""
        if self.val_loader is None:
            return
        for images, labels in self.val_loader:
            yield self.normalize(images), labels.to(self.normalize.device, non_blocking=True)


class SyntheticImages:
    """Random images and labels generated once on the device (measures the model, not the I/O)."""

    def __init__(
        self,
        *,
        num_images: int,
        num_classes: int,
        image_size: int,
        batch_size: int,
        world_size: int,
        rank: int,
        seed: int,
        device: torch.device,
        channels_last: bool,
    ):
        generator = torch.Generator(device=device)
        generator.manual_seed(derive_seed(seed, "synthetic", rank))
        shape = (batch_size, 3, image_size, image_size)
        images = torch.randn(shape, generator=generator, device=device)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.images = images.contiguous(memory_format=fmt)
        self.labels = torch.randint(
            0, num_classes, (batch_size,), generator=generator, device=device
        )
        self.steps_per_epoch = max(1, num_images // (batch_size * world_size))

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        for _ in range(start_batch, self.steps_per_epoch):
            yield self.images, self.labels

    def validation(self, batch_size: int) -> Iterator[Batch]:
        return iter(())


def load_splits(
    data_dir: Path, *, val_fraction: float, seed: int
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]], list[str]]:
    """Train and validation items of ``data_dir`` (``val/`` if present, else a seeded split)."""
    data_dir = Path(data_dir)
    train, class_names = list_images(data_dir / "train")
    if len(class_names) < 2:
        raise DataError(f"{data_dir / 'train'} has one class folder; a classifier needs >= 2")
    if (data_dir / "val").is_dir():
        val, _ = list_images(data_dir / "val", class_names)
    else:
        train, val = split_train_val(train, val_fraction, seed)
    return train, val, class_names


def estimated_cache_bytes(num_images: int, image_size: int) -> int:
    return num_images * 3 * image_size * image_size


def default_num_workers(device: torch.device, local_world_size: int) -> int:
    """0 on CPU (workers would compete with the compute threads); else a share of the cores."""
    if device.type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, min(12, (cores or 2) // max(1, local_world_size) - 1))
