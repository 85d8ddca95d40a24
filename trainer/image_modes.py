"""Every picture as 8-bit RGB, whatever Pillow opened it as, or a refusal naming the mode.

``Image.convert("RGB")`` alone is silently wrong for some modes: it clips a 16-bit grayscale
PNG (``I;16``, 0-65535) at 255, so a mid-grey picture becomes almost all white, and it drops
alpha without saying what lies under it. Here:

- the EXIF orientation is applied first (a phone's portrait photo is stored sideways);
- ``RGB`` stays as it is; ``L``, ``1``, ``CMYK``, ``YCbCr``, ``RGBX`` are converted by Pillow;
- 16-bit and 32-bit integer grey (``I;16*``, ``I``) is scaled from its full range
  (0-65535) to 0-255; ``I`` with values outside 0-65535 is refused;
- alpha (``RGBA``, ``LA``, ``PA``, ``RGBa``, ``La``, palette pictures with transparency) is
  composited over white, as a viewer shows the picture;
- floating-point pictures (``F``) and colour spaces Pillow cannot convert (``LAB``, ``HSV``)
  are refused: there is no one right scale or conversion for them.
"""

from __future__ import annotations

from typing import cast

from PIL import Image, ImageOps

RGB = "RGB"
_PILLOW_CONVERTS = frozenset({"L", "1", "CMYK", "YCbCr", "RGBX"})
_WITH_ALPHA = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT = 65535


class UnsupportedImageMode(ValueError):
    """A picture whose pixels have no one right conversion to 8-bit RGB."""


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` (loaded) as an 8-bit RGB picture, upright; UnsupportedImageMode if its mode
    cannot be converted without guessing."""
    image = ImageOps.exif_transpose(image)
    mode = image.mode
    if mode == RGB:
        return image
    if mode == "P":
        has_alpha = "transparency" in image.info
        return _over_white(image.convert("RGBA")) if has_alpha else image.convert(RGB)
    if mode in _WITH_ALPHA:
        return _over_white(image.convert("RGBA"))
    if mode in _PILLOW_CONVERTS:
        return image.convert(RGB)
    if mode.startswith("I;16") or mode == "I":
        return _sixteen_bit_grey(image)
    raise UnsupportedImageMode(
        f"its pixels are {mode!r} ({_MODE_WORDS.get(mode, 'a mode without one RGB reading')}); "
        "save it as 8-bit RGB or grayscale (e.g. PNG or JPEG)"
    )


_MODE_WORDS = {
    "F": "32-bit floating point, with no one range to scale",
    "LAB": "CIE L*a*b*, which Pillow does not convert to RGB",
    "HSV": "hue-saturation-value, which Pillow does not convert to RGB",
}


def _over_white(rgba: Image.Image) -> Image.Image:
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert(RGB)


def _sixteen_bit_grey(image: Image.Image) -> Image.Image:
    """0-65535 grey to 0-255 grey, as RGB (``I`` is 32-bit: its values must fit 16 bits)."""
    wide = image if image.mode == "I" else image.convert("I")
    low, high = cast("tuple[int, int]", wide.getextrema())  # one band: (min, max)
    if low < 0 or high > _SIXTEEN_BIT:
        raise UnsupportedImageMode(
            f"its pixels are 32-bit integers from {low} to {high}, beyond 16 bits; save it as "
            "8-bit or 16-bit grayscale"
        )
    grey = wide.point(lambda value: value / 257, mode="L")  # 65535 / 255 = 257 exactly
    return grey.convert(RGB)
