"""Crop, resize and mirror uint8 images with torch alone, pixel for pixel as torchvision's v2
functions do (``pil_to_tensor``, ``resize`` with antialiasing, ``center_crop``,
``horizontal_flip``), so that a DataLoader worker never imports torchvision.

Importing torchvision imports ``torch._dynamo`` (through ``torchvision.ops``) and sympy with it:
measured here, 2.2 CPU-s and 85 MB of resident memory on top of torch's own 2 s and 218 MB, in
every process that does. A worker only decodes, crops, resizes and flips, so it pays torch's part
alone: half the CPU to start, and on a node of 8 GPUs with a dozen workers each (train and
validation), gigabytes less memory. The training process and the evaluation still use
torchvision (models, ``eval_transform``). ``tests/trainer/test_pixels.py`` holds every function
here equal to torchvision's, on images of many sizes.
"""

from __future__ import annotations

import functools
import platform

import numpy as np
import torch
from PIL import Image
from torch.nn.functional import interpolate


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """A PIL image → uint8 CHW tensor (a CHW view of a copy of its HWC pixels)."""
    pixels = torch.as_tensor(np.array(image, copy=True))
    return pixels.view(image.height, image.width, len(image.getbands())).permute(2, 0, 1)


@functools.cache
def _native_uint8_bilinear() -> bool:
    """Whether torch resizes uint8 images itself on this CPU (torchvision's rule: AVX2, AVX512
    or ARM); otherwise the pixels go through float32 and are rounded back."""
    capability = torch.backends.cpu.get_cpu_capability()
    return capability in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """A uint8 CHW image on the CPU resized to ``height`` x ``width``: bilinear, antialiased."""
    channels, old_height, old_width = image.shape
    if (height, width) == (old_height, old_width):
        return image
    batch = image.reshape(1, channels, old_height, old_width)
    strides = batch.stride()
    if batch.is_contiguous(memory_format=torch.channels_last) and batch.numel() != strides[0]:
        # A single HWC-backed image: restrided so that torch keeps it channels-last (torchvision
        # does the same; the uint8 kernel then takes the same path, with the same rounding).
        batch = batch.as_strided(batch.shape, (batch.numel(), *strides[1:]))
    native = _native_uint8_bilinear()
    if not native:
        batch = batch.to(torch.float32)
    out = interpolate(
        batch, size=[height, width], mode="bilinear", align_corners=False, antialias=True
    )
    if not native:
        out = out.round_().to(torch.uint8)
    return out.reshape(channels, height, width)


def shorter_side_size(height: int, width: int, size: int) -> tuple[int, int]:
    """The (height, width) that resizing the shorter side to ``size`` gives (aspect kept)."""
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def center_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size`` x ``size`` window of a CHW image at least that big."""
    height, width = image.shape[-2:]
    top, left = int(round((height - size) / 2.0)), int(round((width - size) / 2.0))
    return image[..., top : top + size, left : left + size]


def horizontal_flip(image: torch.Tensor) -> torch.Tensor:
    return image.flip(-1)
