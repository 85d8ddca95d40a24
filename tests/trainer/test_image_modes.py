"""Every picture mode Pillow opens becomes the 8-bit RGB a viewer would show, or is refused by
name: never silently wrong (a 16-bit PNG clipped to white, a sideways photo, alpha's hidden
colours)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trainer.data import load_image
from trainer.errors import DataError
from trainer.image_modes import to_rgb


def _saved(image: Image.Image, tmp_path: Path, name: str, **options) -> Path:
    path = tmp_path / name
    image.save(path, **options)
    return path


def _pixels(path: Path) -> np.ndarray:
    return np.asarray(load_image(path))


def test_a_16_bit_grey_png_is_scaled_not_clipped(tmp_path):
    """convert("RGB") clipped it at 255: a mid-grey picture came out 99% white."""
    ramp = (np.arange(256 * 256, dtype=np.uint32).reshape(256, 256)).astype(np.uint16)
    path = _saved(Image.fromarray(ramp), tmp_path, "ramp16.png")
    with Image.open(path) as opened:
        assert opened.mode == "I;16"
    pixels = _pixels(path)
    assert pixels.shape == (256, 256, 3) and pixels.dtype == np.uint8
    assert (pixels == 255).mean() < 0.01
    expected = (ramp.astype(np.float64) / 257).astype(np.uint8)
    assert np.array_equal(pixels[..., 0], expected)


def test_32_bit_grey_within_16_bits_is_scaled_and_beyond_is_refused(tmp_path):
    grey = Image.fromarray(np.full((4, 4), 65535, dtype=np.int32), mode="I")
    assert np.asarray(to_rgb(grey)).min() == 255
    too_wide = Image.fromarray(np.full((4, 4), 70000, dtype=np.int32), mode="I")
    path = _saved(too_wide, tmp_path, "wide.tiff")
    with pytest.raises(DataError, match=r"wide\.tiff.*beyond 16 bits"):
        load_image(path)


@pytest.mark.parametrize(
    ("mode", "colour", "expected"),
    [
        ("RGBA", (255, 0, 0, 0), (255, 255, 255)),  # fully transparent: the white behind it
        ("RGBA", (255, 0, 0, 255), (255, 0, 0)),
        ("RGBA", (0, 0, 0, 128), (127, 127, 127)),
        ("LA", (0, 0), (255, 255, 255)),
        ("LA", (100, 255), (100, 100, 100)),
    ],
)
def test_alpha_is_composited_over_white(tmp_path, mode, colour, expected):
    path = _saved(Image.new(mode, (4, 4), colour), tmp_path, f"{mode}.png")
    assert tuple(_pixels(path)[0, 0]) == expected


def test_a_palette_picture_with_a_transparent_colour(tmp_path):
    image = Image.new("P", (4, 4), 0)
    image.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    image.putpixel((0, 0), 1)
    path = _saved(image, tmp_path, "palette.png", transparency=0)
    pixels = _pixels(path)
    assert tuple(pixels[0, 0]) == (0, 0, 255)
    assert tuple(pixels[1, 1]) == (255, 255, 255)  # index 0 is transparent


@pytest.mark.parametrize(
    ("mode", "colour", "expected"),
    [
        ("L", 77, (77, 77, 77)),
        ("1", 1, (255, 255, 255)),
        ("CMYK", (0, 255, 255, 0), (255, 0, 0)),
        ("P", 0, (0, 0, 0)),
    ],
)
def test_modes_without_alpha(tmp_path, mode, colour, expected):
    suffix = "jpg" if mode == "CMYK" else "png"
    options = {"quality": 100} if mode == "CMYK" else {}
    path = _saved(Image.new(mode, (8, 8), colour), tmp_path, f"{mode}.{suffix}", **options)
    assert np.abs(_pixels(path)[4, 4].astype(int) - expected).max() <= 2


def test_the_exif_orientation_is_applied(tmp_path):
    """A phone stores a portrait photo sideways, with orientation 6 (turn 90° clockwise)."""
    image = Image.new("RGB", (40, 20), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 10, 20))  # red on the stored picture's left
    exif = Image.Exif()
    exif[0x0112] = 6
    path = _saved(image, tmp_path, "sideways.jpg", exif=exif, quality=95)
    pixels = _pixels(path)
    assert pixels.shape == (40, 20, 3)  # upright: taller than wide
    assert pixels[2, 10, 0] > 200 and pixels[2, 10, 2] < 60  # the left is now on top


def test_a_float_picture_is_refused_naming_the_file_and_mode(tmp_path):
    path = _saved(Image.new("F", (4, 4), 0.5), tmp_path, "depth.tiff")
    with pytest.raises(DataError, match=r"depth\.tiff.*'F'.*floating point"):
        load_image(path)


def test_gpu_bytes_of_a_sideways_jpeg_are_upright(tmp_path):
    """nvJPEG ignores EXIF: such a file is re-encoded upright before it goes to the GPU."""
    from trainer.gpu_decode import read_encoded

    image = Image.new("RGB", (40, 20), (0, 0, 255))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = _saved(image, tmp_path, "sideways.jpg", exif=exif, quality=95)
    encoded = read_encoded(str(path))
    assert (encoded.height, encoded.width) == (40, 20)
    with Image.open(io.BytesIO(encoded.data)) as decoded:
        assert decoded.size == (20, 40)
    plain = _saved(image, tmp_path, "plain.jpg", quality=95)
    assert read_encoded(str(plain)).data == plain.read_bytes()  # upright: sent as it is
