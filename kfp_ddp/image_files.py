"""Which files of a data set are images: the one list the pipeline's data step (which counts and
checks them without torch) and the trainer (which trains on them) both go by, so that they never
disagree on what a class holds or how many steps an epoch has.

torchvision's ImageFolder list (``.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp``) and GIF;
case does not matter. A class's images are those in its folder and, as torchvision's ImageFolder
reads them, in any of its sub-folders (Tiny ImageNet keeps them in ``train/<class>/images/``),
but not in a hidden one (``.ipynb_checkpoints``). Every other file under ``<split>/`` is
skipped, and named by the data step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

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


def is_class_image(parts: Sequence[str]) -> bool:
    """Whether the file at ``parts`` under a split folder (``[class, ..., name]``) is an image of
    that class: an image file in the class folder or in a sub-folder of it, no folder on the way
    hidden."""
    return (
        len(parts) >= 2
        and is_image_file(parts[-1])
        and not any(part.startswith(".") for part in parts[:-1])
    )


def class_images(folder: str | os.PathLike) -> Iterator[str]:
    """The images of class folder ``folder``, by their paths relative to it ('/' between parts;
    in no order): its image files and its sub-folders', hidden entries skipped. A sub-folder
    linked to is read once however many links reach it. ``OSError`` if a folder cannot be
    listed."""
    top = os.stat(folder)
    seen = {(top.st_dev, top.st_ino)}
    pending = [""]
    while pending:
        relative = pending.pop()
        with os.scandir(os.path.join(folder, relative)) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                path = f"{relative}{entry.name}"
                if entry.is_dir():
                    where = entry.stat()
                    if (where.st_dev, where.st_ino) not in seen:
                        seen.add((where.st_dev, where.st_ino))
                        pending.append(f"{path}/")
                elif is_image_file(entry.name) and entry.is_file():
                    yield path
