"""The cost of reading every image once before step 1 (``trainer.image_check``), against one
epoch's decoding of the same files.

Generates an ImageNet-like folder (500x375 JPEGs, ``--images``, 10 classes) once, then measures
in this process, on one thread each (so the figures are per core):

* ``epoch decode`` (the named baseline): what a DataLoader worker does per image in an epoch,
  ``trainer.data.load_image`` (full decode to RGB);
* ``check``: ``trainer.image_check.read_problem`` (JPEGs decoded at 1/8 scale, converted as the
  loaders convert).

Printed: images/s of each and the check's cost as a share of one epoch's decoding. On a GPU node
the epoch is bound by the GPUs, not by decoding, so this share is an upper bound of the check's
share of an epoch; the check also runs in threads on every rank's share of the files.

    python benchmarks/image_check.py                 # CPU here: small and quick
    python benchmarks/image_check.py --images 20000  # closer to a real data set
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data import load_image  # noqa: E402
from trainer.image_check import read_problem  # noqa: E402


def _write_folder(root: Path, images: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(images):
        folder = root / "train" / f"class_{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        small = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
        picture = Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC)
        noisy = np.asarray(picture, dtype=np.int16) + rng.integers(-12, 12, (375, 500, 3))
        path = folder / f"{i:06d}.jpg"
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(str(path))
    return paths


def _rate(work, paths: list[str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for path in paths:
            work(path)
        best = min(best, time.perf_counter() - started)
    return len(paths) / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-bench-check-") as tmp:
        paths = _write_folder(Path(tmp), args.images)
        decode = _rate(load_image, paths, args.repeats)
        check = _rate(read_problem, paths, args.repeats)
    print(f"{args.images} JPEGs of 500x375, one thread each (best of {args.repeats}):")
    print(f"  epoch decode (baseline): {decode:8.0f} images/s per core")
    print(f"  check before step 1:     {check:8.0f} images/s per core")
    print(f"  check / epoch decode:    {decode / check:8.2f} (the check's cost as a share of")
    print("                                    one epoch's decoding of the same files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
