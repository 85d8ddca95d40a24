"""``--decode gpu``: DataLoader workers read bytes; the GPU decodes, crops, flips and resizes.

A 500x375 JPEG costs a CPU core ~1.6 ms to decode and ~0.75 ms to crop and resize: with 16 cores
per GPU that feeds ~4,000 images/s at best, below what an H100 trains ResNet-50 at. Here a worker
only reads the file, parses its header (size, colour mode) and draws the sample's crop window and
flip with :func:`trainer.randomness.sample_augmentation` -- the same seeds and windows as the CPU
path -- and ships the bytes. The training process decodes the whole batch with
``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG; baseline JPEGs go to the hardware
JPEG engines of A100/H100 without using the SMs), then crops, resizes (bilinear, antialiased, as
the CPU path) and flips each image on the GPU.

Files nvJPEG cannot take (PNG and other formats, CMYK or other unusual JPEG colour modes) are
decoded by the worker with PIL and re-encoded as a quality-95 JPEG, so a batch is always a list of
JPEGs; a data set of mostly such files is better served by ``--decode cpu`` or by re-encoding it
once with ``python -m trainer.prepare``.

Everything but :class:`GpuJpegDecoder` is plain CPU code (tested on CPU); the decoder needs a CUDA
build of torchvision (tested where CUDA exists).
"""

from __future__ import annotations

import functools
import io
from typing import NamedTuple

import torch
from PIL import Image, UnidentifiedImageError

from trainer.errors import DataError
from trainer.image_modes import to_rgb
from trainer.randomness import SampleAugmentation
from trainer.tv_compat import import_torchvision

GPU_COLOUR_MODES = ("RGB", "L")
"""JPEG colour modes handed to nvJPEG as they are (decoded to RGB there, as PIL's convert does)."""
EXIF_ORIENTATION = 0x0112
FALLBACK_QUALITY = 95
NO_AUGMENTATION = (-1, -1, -1, -1, 0)
"""The window row of an image that gets the evaluation resize and centre crop."""


class EncodedImage(NamedTuple):
    """One file as a worker ships it: JPEG bytes and the image's size in pixels."""

    data: bytes
    height: int
    width: int


def read_encoded(path: str) -> EncodedImage:
    """The JPEG bytes of ``path`` (re-encoded when nvJPEG cannot take the file as it is).

    Reads the header only, unless the file needs re-encoding. :class:`DataError` naming the file
    if it is unreadable.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            upright = image.getexif().get(EXIF_ORIENTATION, 1) == 1  # nvJPEG ignores EXIF
            if image.format == "JPEG" and image.mode in GPU_COLOUR_MODES and upright:
                return EncodedImage(data, height, width)
            image.load()
            rgb = to_rgb(image)
            width, height = rgb.size
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(f"cannot read image {path}: {err}; fix or delete the file") from err
    buffer = io.BytesIO()
    rgb.save(buffer, format="JPEG", quality=FALLBACK_QUALITY)
    return EncodedImage(buffer.getvalue(), height, width)


class EncodedSample(NamedTuple):
    """A worker's product for one image: its bytes, where to crop it, and its label."""

    data: bytes
    window: tuple[int, int, int, int, int]
    """``(top, left, height, width, flip)`` in source pixels, or :data:`NO_AUGMENTATION`."""
    label: int


def encoded_sample(
    image: EncodedImage, augmentation: SampleAugmentation | None, label: int
) -> EncodedSample:
    window = NO_AUGMENTATION if augmentation is None else (*augmentation[:4], int(augmentation[4]))
    return EncodedSample(image.data, window, label)


class EncodedBatch(NamedTuple):
    """A batch of JPEGs in one buffer (pinned as one piece), with their windows and labels."""

    data: torch.Tensor
    """uint8: the files' bytes, concatenated."""
    offsets: torch.Tensor
    """int64, batch size + 1: image ``i`` is ``data[offsets[i]:offsets[i + 1]]``."""
    windows: torch.Tensor
    """int64, batch size x 5: ``(top, left, height, width, flip)`` rows."""
    labels: torch.Tensor

    def payloads(self) -> list[torch.Tensor]:
        bounds = self.offsets.tolist()
        return [self.data[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def collate_encoded(samples: list[EncodedSample]) -> EncodedBatch:
    """DataLoader ``collate_fn``: runs in the worker; the batch crosses processes as 4 tensors."""
    lengths = torch.tensor([len(sample.data) for sample in samples], dtype=torch.int64)
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    data = torch.frombuffer(bytearray(b"".join(s.data for s in samples)), dtype=torch.uint8)
    return EncodedBatch(
        data=data,
        offsets=offsets,
        windows=torch.tensor([sample.window for sample in samples], dtype=torch.int64),
        labels=torch.tensor([sample.label for sample in samples], dtype=torch.int64),
    )


class DecodedJpegs(NamedTuple):
    """A batch after nvJPEG: full-size CHW uint8 images on the GPU; windows, labels on the CPU."""

    images: list[torch.Tensor]
    windows: torch.Tensor
    labels: torch.Tensor


# ------------------------------------------------------------------------------------ on the GPU
@functools.cache
def _tiny_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 12), (200, 30, 60)).save(buffer, format="JPEG")
    return buffer.getvalue()


def gpu_decode_problem(device: torch.device) -> str | None:
    """Why JPEGs cannot be decoded on ``device`` here, or None when they can (decodes a probe)."""
    if device.type != "cuda":
        return f"the training device is {device}, not a CUDA GPU"
    try:
        import_torchvision()
        from torchvision.io import ImageReadMode, decode_jpeg

        probe = torch.frombuffer(bytearray(_tiny_jpeg()), dtype=torch.uint8)
        decoded = decode_jpeg([probe], mode=ImageReadMode.RGB, device=device)
        if tuple(decoded[0].shape) != (3, 12, 16):
            return f"torchvision decoded a 16x12 probe JPEG to shape {tuple(decoded[0].shape)}"
    except Exception as err:  # any failure means: not usable here; the caller names it
        return f"torchvision.io.decode_jpeg(device={str(device)!r}) failed: {err}"
    return None


class GpuJpegDecoder:
    """:class:`EncodedBatch` → uint8 NCHW ``image_size``² batch on ``device``."""

    def __init__(self, device: torch.device, image_size: int):

        import_torchvision()
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional

        self.device, self.image_size = device, image_size
        self._decode = functools.partial(decode_jpeg, mode=ImageReadMode.RGB, device=device)
        self._functional = functional

    def __call__(self, batch: EncodedBatch) -> torch.Tensor:
        return self.crop(self.decode(batch))

    def decode(self, batch: EncodedBatch) -> DecodedJpegs:
        """nvJPEG decodes the batch (blocks this thread until it is done)."""
        try:
            images = self._decode(batch.payloads())
        except RuntimeError as err:
            raise DataError(
                f"nvJPEG could not decode a batch ({err}); find the file with --decode cpu, "
                "which names it, or re-encode the data set with python -m trainer.prepare"
            ) from err
        return DecodedJpegs(images, batch.windows, batch.labels)

    def crop(self, decoded: DecodedJpegs) -> torch.Tensor:
        """Each image cropped to its window, resized, and mirrored where its flip says so.

        Two kernels per image (the crop to float, the antialiased resize); rounding, the uint8
        cast and the flips run once on the whole batch: kernel launches from this thread, not
        the GPU, bounded the rate when each image also had its own round, clamp and copy.
        """
        windows = decoded.windows
        resized = [
            self._crop_resize(image, window)
            for image, window in zip(decoded.images, windows.tolist(), strict=True)
        ]
        out = torch.cat(resized).round_().clamp_(0, 255).to(torch.uint8)
        flips = windows[:, 4].to(self.device, non_blocking=True).bool()
        return torch.where(flips.view(-1, 1, 1, 1), out.flip(-1), out)

    def _crop_resize(self, image: torch.Tensor, window: list[int]) -> torch.Tensor:
        """One image as 1 x 3 x size x size float, resized as the CPU path does (bilinear,
        antialiased; the caller rounds to uint8 as the CPU path does)."""
        top, left, height, width, _ = window
        size = self.image_size
        if height < 0:  # evaluation: shorter side to size, centre crop (torchvision's, on CUDA)
            resized = self._functional.resize(image, [size], antialias=True)
            return self._functional.center_crop(resized, [size]).unsqueeze(0).float()
        # torchvision's resize does the same on CUDA uint8 (float, interpolate, round); called
        # directly it costs a third of the Python time per image, which bounds a batch here.
        crop = image[:, top : top + height, left : left + width].unsqueeze(0).float()
        return torch.nn.functional.interpolate(
            crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
