"""Every random choice of the input pipeline is a pure function of ``(seed, epoch, position)``.

* sample order: ``DistributedSampler(seed)`` with ``set_epoch(epoch)`` (:mod:`trainer.data`);
* streamed images: the crop window and flip of image ``index`` in ``epoch`` are drawn by
  :func:`sample_augmentation` from a generator seeded with ``derive_seed(seed, "sample", epoch,
  index)``. The CPU decoder (a DataLoader worker) and the GPU decoder (the training process) both
  use these windows, so the choice of decoder never changes which crop an image gets;
* cached images: one generator per batch seeded with ``(seed, "aug", epoch, batch, rank)``;
* dropout and the like: the training loop reseeds the global generators before every step.

A resumed run therefore replays exactly the batches an uninterrupted run would have seen, without
saving any generator state. The draws are torchvision's ``RandomResizedCrop(scale=(0.35, 1))``
followed by ``RandomHorizontalFlip()``, made from an explicit CPU generator: no global generator
is touched, and seeding costs microseconds (``torch.manual_seed`` would also seed CUDA, whose lazy
initialisation costs 0.1-0.3 ms per call in a DataLoader worker).
"""

from __future__ import annotations

import hashlib
import math
from typing import NamedTuple

import torch

CROP_SCALE = (0.35, 1.0)
"""Area share of the random crop (torchvision's default is (0.08, 1); 0.35 suits small images)."""
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class SampleAugmentation(NamedTuple):
    """Where to crop one training image (source pixels) and whether to mirror the result."""

    top: int
    left: int
    height: int
    width: int
    flip: bool


def sample_augmentation(
    seed: int, epoch: int, index: int, height: int, width: int, augment: str
) -> SampleAugmentation | None:
    """The augmentation of image ``index`` (``height`` x ``width`` pixels) in ``epoch``.

    None for ``augment="none"``: the image gets the evaluation resize and centre crop.
    """
    if augment == "none":
        return None
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, "sample", epoch, index))
    top, left, crop_h, crop_w = random_resized_crop(height, width, generator)
    flip = augment == "crop-flip" and bool(torch.rand(1, generator=generator) < 0.5)
    return SampleAugmentation(top, left, crop_h, crop_w, flip)


_LOG_RATIO = torch.log(torch.tensor(CROP_RATIO))


def random_resized_crop(
    height: int, width: int, generator: torch.Generator
) -> tuple[int, int, int, int]:
    """``(top, left, height, width)``: torchvision's RandomResizedCrop draws, from ``generator``.

    The same sequence of draws as ``torchvision.transforms.v2.RandomResizedCrop.make_params``
    (tested against it), so windows match what the trainer drew before it had its own.
    """
    area = height * width
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(*CROP_SCALE, generator=generator).item()
        low, high = float(_LOG_RATIO[0]), float(_LOG_RATIO[1])
        aspect = torch.exp(torch.empty(1).uniform_(low, high, generator=generator)).item()
        crop_w = int(round(math.sqrt(target_area * aspect)))
        crop_h = int(round(math.sqrt(target_area / aspect)))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            top = int(torch.randint(0, height - crop_h + 1, (1,), generator=generator).item())
            left = int(torch.randint(0, width - crop_w + 1, (1,), generator=generator).item())
            return top, left, crop_h, crop_w
    # No fitting window in ten tries: the largest centred window of an allowed aspect ratio.
    in_ratio = width / height
    if in_ratio < min(CROP_RATIO):
        crop_w, crop_h = width, int(round(width / min(CROP_RATIO)))
    elif in_ratio > max(CROP_RATIO):
        crop_h, crop_w = height, int(round(height * max(CROP_RATIO)))
    else:
        crop_h, crop_w = height, width
    return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w
