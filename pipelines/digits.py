"""The demo's data set: scikit-learn's bundled handwritten digits as an ImageFolder of PNGs.

1,797 real 8x8 scans (UCI "Optical Recognition of Handwritten Digits"), shipped inside
scikit-learn, so the demo needs no download. Written deterministically (same bytes every time), so
the S3 sync of a second demo run finds nothing to transfer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from kfp_ddp.atomic_files import write_atomic

CLASS_NAMES = tuple(str(d) for d in range(10))


def write_grey_png(pixels: np.ndarray, path: Path) -> None:
    """Write 8-bit grey ``pixels`` to ``path`` as a PNG, atomically."""
    image = Image.fromarray(pixels, mode="L")
    write_atomic(path, lambda handle: image.save(handle, format="PNG", optimize=False))


def write_digits_image_folder(
    root: Path, *, image_size: int = 32, val_fraction: float = 0.2, seed: int = 0
) -> dict[str, int]:
    """Write ``root/{train,val}/<digit>/<index>.png`` and return the image count per split.

    The split is stratified and fixed by ``seed``; images are upscaled from 8x8 to ``image_size``
    (bilinear) as 8-bit grayscale. Files whose bytes would not change are left alone.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be between 0 and 1 (exclusive)")
    if not 8 <= image_size <= 512:
        raise ValueError(f"image_size={image_size} must be between 8 and 512 pixels")
    digits = load_digits()
    indices = np.arange(len(digits.target))
    train_idx, val_idx = train_test_split(
        indices, test_size=val_fraction, stratify=digits.target, random_state=seed
    )
    counts = {}
    for split, split_idx in (("train", train_idx), ("val", val_idx)):
        for i in sorted(split_idx):
            label = CLASS_NAMES[digits.target[i]]
            path = root / split / label / f"{i:04d}.png"
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            small = Image.fromarray((digits.images[i] * (255.0 / 16.0)).astype(np.uint8), mode="L")
            big = small.resize((image_size, image_size), Image.Resampling.BILINEAR)
            write_grey_png(np.asarray(big), path)
        counts[split] = len(split_idx)
    return counts
