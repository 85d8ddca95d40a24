"""Input data: decoded images (PIL), their transforms, and the in-memory and synthetic sources.

Where the other parts live: the file list in :mod:`trainer.listing`, the seeded randomness in
:mod:`trainer.randomness`, streaming by DataLoader workers in :mod:`trainer.loader`, GPU JPEG
decoding in :mod:`trainer.gpu_decode`, and the choice between them in :mod:`trainer.folder_data`.

Public helpers other parts import: :func:`list_images`, :func:`load_image`, :func:`eval_transform`,
:data:`IMAGENET_MEAN`, :data:`IMAGENET_STD`, :func:`derive_seed`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import torch
from PIL import Image, UnidentifiedImageError

from trainer.epoch_size import steps_per_epoch
from trainer.errors import DataError
from trainer.image_modes import to_rgb
from trainer.listing import IMAGE_EXTENSIONS as IMAGE_EXTENSIONS
from trainer.listing import ImageListing
from trainer.listing import list_images as list_images
from trainer.pixels import center_crop, horizontal_flip, resize, shorter_side_size
from trainer.pixels import pil_to_tensor as pixels_of
from trainer.randomness import SampleAugmentation
from trainer.randomness import derive_seed as derive_seed
from trainer.tv_compat import import_torchvision

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Decoded data sets up to this size are kept in memory (on the training device) as uint8.
CACHE_LIMIT_BYTES = 512 * 2**20

Batch = tuple[torch.Tensor, torch.Tensor]


# --------------------------------------------------------------------------------- decoding (PIL)
def load_image(path: Path | str) -> Image.Image:
    """Decode ``path`` with PIL as upright 8-bit RGB (:func:`trainer.image_modes.to_rgb`);
    :class:`DataError` naming the file if it is unreadable or its mode has no one RGB reading."""
    try:
        with Image.open(path) as image:
            image.load()
            return to_rgb(image)  # an upright RGB JPEG (most of them) is returned, not copied
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(f"cannot read image {path}: {err}; fix or delete the file") from err


def _v2():
    import_torchvision()
    from torchvision.transforms import v2

    return v2


def eval_transform(
    image_size: int, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> Callable[[Image.Image], torch.Tensor]:
    """PIL image → normalised float CHW tensor: resize the shorter side, centre crop, normalise."""
    v2 = _v2()
    return v2.Compose(
        [
            resize_crop(image_size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(mean), list(std)),
        ]
    )


def resize_crop(image_size: int) -> Callable[[Image.Image], torch.Tensor]:
    """PIL → uint8 CHW tensor at ``image_size``²: the shorter side resized to ``image_size``,
    then the centre crop; torchvision's ``PILToTensor``, ``Resize`` and ``CenterCrop`` pixel for
    pixel, without importing torchvision (:mod:`trainer.pixels`: DataLoader workers call it).
    A partial of a module function, so that it pickles into spawned workers."""
    return functools.partial(_resized_and_cropped, size=image_size)


def _resized_and_cropped(image: Image.Image, size: int) -> torch.Tensor:
    height, width = shorter_side_size(image.height, image.width, size)
    return center_crop(resize(pixels_of(image), height, width), size)


def augmented_tensor(
    image: Image.Image, augmentation: SampleAugmentation | None, image_size: int
) -> torch.Tensor:
    """PIL image → uint8 CHW ``image_size``² tensor: crop the window, resize, maybe mirror.

    The pixels ``RandomResizedCrop`` + ``RandomHorizontalFlip`` gave for the same window (tested),
    converting only the cropped part to a tensor. Without a window: :func:`resize_crop`.
    """
    if augmentation is None:
        return resize_crop(image_size)(image)
    top, left, height, width, flip = augmentation
    crop = pixels_of(image.crop((left, top, left + width, top + height)))
    out = resize(crop, image_size, image_size)
    return horizontal_flip(out) if flip else out


# ------------------------------------------------------------------------------ on the device
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
def shard_batches(
    num_items: int, batch_size: int, rank: int, world_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """This rank's full batches of one epoch (DistributedSampler order, last partial dropped)."""
    items = cast(torch.utils.data.Dataset, range(num_items))  # a sized sequence is all it reads
    sampler: torch.utils.data.DistributedSampler = torch.utils.data.DistributedSampler(
        items, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
    )
    sampler.set_epoch(epoch)
    order = list(sampler)
    return [order[i : i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]


class CachedImages:
    """A small data set decoded once into a uint8 tensor on the device; augmentation per batch."""

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
        batches = shard_batches(
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
    listing: ImageListing, image_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    to_tensor = resize_crop(image_size)

    def decode(index: int) -> torch.Tensor:
        return to_tensor(load_image(listing.path(index)))

    # PIL releases the GIL while decoding, so threads overlap file reads and decodes.
    threads = max(1, min(8, torch.get_num_threads() * 2))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        tensors = list(pool.map(decode, range(len(listing))))
    if not tensors:
        empty = torch.empty(0, 3, image_size, image_size, dtype=torch.uint8, device=device)
        return empty, torch.empty(0, dtype=torch.long, device=device)
    images = torch.stack(tensors).to(device)
    labels = torch.from_numpy(listing.labels.astype("int64")).to(device)
    return images, labels


def estimated_cache_bytes(num_images: int, image_size: int) -> int:
    return num_images * 3 * image_size * image_size


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
