"""Tiny, learnable ImageFolder data sets written by the tests (PNG files, PIL-encoded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def write_image_folder(
    root: Path,
    *,
    classes: tuple[str, ...] = ("circle", "square", "stripe"),
    per_class: int = 12,
    val_per_class: int | None = 4,
    size: int = 16,
    seed: int = 0,
) -> Path:
    """Write ``root/train/<class>/*.png`` (and ``root/val/...`` unless ``val_per_class`` is None).

    Class ``k`` is a noisy image whose bright band sits at a class-specific row, so even a tiny
    model separates the classes within a few steps.
    """
    rng = np.random.default_rng(seed)
    splits = {"train": per_class} | ({"val": val_per_class} if val_per_class else {})
    for split, count in splits.items():
        for k, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
                band = (k * size) // len(classes)
                pixels[band : band + max(1, size // len(classes)), :, :] = 230
                Image.fromarray(pixels).save(folder / f"{split}-{i:03d}.png")
    return root
