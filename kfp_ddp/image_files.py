"""Which files of a data set are images: the one list the pipeline's data step (which counts and
checks them without torch) and the trainer (which trains on them) both go by, so that they never
disagree on what a class holds or how many steps an epoch has.

torchvision's ImageFolder list (``.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp``) and GIF;
case does not matter. Every other file under ``<split>/<class>/`` is skipped, and named by the
data step.
"""

from __future__ import annotations

IMAGE_EXTENSIONS = (
    ".png",
    ".jpg",
    ".jpeg",
    ".bmp",
    ".gif",
    ".webp",
    ".tif",
    ".tiff",
    ".ppm",
    ".pgm",
)
"""Lower-case suffixes of the image files, with their dot."""


def is_image_file(name: str) -> bool:
    """Whether the training reads file ``name``: an image suffix, and not hidden (macOS's
    ``._IMG_1.jpg`` AppleDouble files, ``.DS_Store``)."""
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)
