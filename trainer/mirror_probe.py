"""``--augment auto``: mirror the training images only when a mirrored image keeps its class.

A left-right mirror is free extra data for photos of objects and animals, and teaches wrong
labels for digits, letters and signs (a mirrored 2 is no 2; on scikit-learn's digits the mirror
cost 0.979 → 0.930 accuracy). Which kind a data set is shows in its own images, before step 1:

1. up to ``PER_CLASS`` training images of each class (``TOTAL`` in all; the first ones of the
   listing), in grey at ``SIZE`` x ``SIZE`` pixels;
2. a nearest-class-mean classifier built from them scores them as they are, and mirrored;
3. mirroring keeps the classes unless it takes away more than half of the classifier's margin
   over chance: ``mirrored - chance < (plain - chance) / 2``, with ``plain - chance`` at least
   ``MIN_MARGIN`` (a data set whose class means say nothing, like most photos, keeps the mirror).

Measured: scikit-learn's digits 0.894 → 0.345 (chance 0.1: the mirror goes), the tests' band
images 1.0 → 1.0 (it stays). The decision and its two figures are logged and kept in
``summary.json`` (``augment``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from trainer.image_modes import to_rgb
from trainer.listing import ImageListing

PER_CLASS = 100
TOTAL = 2000
"""At most this many images in all (fewer per class when there are many classes): a second or
two of decoding, once, on rank 0."""
SIZE = 16
MIN_MARGIN = 0.1
"""The classifier's accuracy over chance below which its figures say nothing about mirrors."""


@dataclass(frozen=True)
class MirrorProbe:
    """What the probe measured and decided."""

    plain: float
    """The nearest-class-mean classifier's accuracy on the images as they are."""
    mirrored: float
    """Its accuracy on the same images mirrored."""
    chance: float
    images: int

    @property
    def keeps_classes(self) -> bool:
        margin = self.plain - self.chance
        if margin < MIN_MARGIN:
            return True
        return self.mirrored - self.chance >= margin / 2

    def augment(self) -> str:
        """The augmentation ``auto`` stands for: crop-flip, or crop when the mirror goes."""
        return "crop-flip" if self.keeps_classes else "crop"

    def line(self) -> str:
        what = (
            "mirroring keeps the classes" if self.keeps_classes else "mirroring changes the classes"
        )
        return (
            f"augment auto: {self.augment()} ({what}: a nearest-class-mean probe of "
            f"{self.images} training images scores {self.mirrored:.3f} on them mirrored, "
            f"{self.plain:.3f} as they are, chance {self.chance:.3f})"
        )

    def record(self) -> dict[str, object]:
        return {
            "augment": self.augment(),
            "probe": {"plain": round(self.plain, 4), "mirrored": round(self.mirrored, 4)},
        }


def probe_mirror(train: ImageListing) -> MirrorProbe:
    """The probe of ``train`` (see the module doc); unreadable images are left out."""
    pictures, labels = [], []
    taken: dict[int, int] = {}
    per_class = max(2, min(PER_CLASS, TOTAL // max(1, len(train.class_names))))
    for index in range(len(train)):
        label = train.label(index)
        if taken.get(label, 0) >= per_class:
            continue
        try:
            with Image.open(train.path(index)) as image:
                grey = to_rgb(image).convert("L").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
                pictures.append(np.asarray(grey, dtype=np.float32) / 255.0)
        except (OSError, ValueError, SyntaxError):
            continue  # the image check names it; the probe does without it
        labels.append(label)
        taken[label] = taken.get(label, 0) + 1
    classes = len(train.class_names)
    if not pictures:
        return MirrorProbe(plain=0.0, mirrored=0.0, chance=1.0 / classes, images=0)
    x, y = np.stack(pictures), np.asarray(labels)
    present = sorted(set(labels))
    means = np.stack([x[y == label].mean(axis=0) for label in present]).reshape(len(present), -1)
    expected = np.searchsorted(present, y)

    def accuracy(images: np.ndarray) -> float:
        flat = images.reshape(len(images), -1)
        # |x - m|^2 without the |x|^2 term, the same for every class: one matrix product
        distance = (means**2).sum(axis=1)[None, :] - 2.0 * flat @ means.T
        return float((distance.argmin(axis=1) == expected).mean())

    return MirrorProbe(
        plain=accuracy(x),
        mirrored=accuracy(x[:, :, ::-1]),
        chance=1.0 / len(present),
        images=len(labels),
    )
