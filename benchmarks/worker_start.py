"""What one DataLoader worker costs to start: its CPU seconds and its resident memory once it has
made its first samples, as the trainer's workers do (``trainer.pixels``: torch alone) against the
named baseline, the same samples made with torchvision's v2 functions (what the workers did
before: importing torchvision imports ``torch._dynamo`` and sympy).

Each round starts two fresh processes, one of each, one after the other, with one thread each;
each decodes, crops, resizes and flips 8 images of a 375x500 JPEG (the worker's first batch).
Printed: every round's figures, the medians and the ratios (ours / baseline). Workers are
persistent, so this is paid once per worker and run; the memory stays for the whole run, in
every worker of every training process of the node.

    python benchmarks/worker_start.py              # ~1 minute on 2 cores
    python benchmarks/worker_start.py --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import json, resource, sys
from PIL import Image
path, variant = sys.argv[1], sys.argv[2]
if variant == "torchvision":
    from trainer.tv_compat import import_torchvision
    import_torchvision()
    from torchvision.transforms.v2 import functional
    def sample(image, top, left, height, width):
        pixels = functional.pil_to_tensor(image)
        out = functional.resized_crop(pixels, top, left, height, width, [224, 224], antialias=True)
        return functional.horizontal_flip(out)
else:
    from trainer.data import augmented_tensor
    from trainer.randomness import SampleAugmentation
    def sample(image, top, left, height, width):
        window = SampleAugmentation(top, left, height, width, True)
        return augmented_tensor(image, window, 224)
for index in range(8):
    with Image.open(path) as image:
        image = image.convert("RGB")
    assert sample(image, 10 + index, 20, 300, 400).shape == (3, 224, 224)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
                  "torchvision": "torchvision" in sys.modules}))
"""

VARIANTS = ("torchvision", "ours")


def run(image: Path, variant: str) -> dict[str, float]:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(image), variant],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(done.stdout)
    assert figures["torchvision"] == (variant == "torchvision"), figures
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        image = Path(folder) / "photo.jpg"
        pixels = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(image, quality=90)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
        for round_number in range(1, args.rounds + 1):
            for name in VARIANTS:
                results[name].append(run(image, name))
            last = {name: results[name][-1] for name in VARIANTS}
            line = "  ".join(
                f"{name}: {r['cpu_s']:.2f} CPU-s {r['rss_mb']:.0f} MB" for name, r in last.items()
            )
            print(f"round {round_number}: {line}", flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in ("cpu_s", "rss_mb")}
        for name, runs in results.items()
    }
    base, ours = medians["torchvision"], medians["ours"]
    print(
        f"median, baseline (torchvision's functions): {base['cpu_s']:.2f} CPU-s, "
        f"{base['rss_mb']:.0f} MB resident"
    )
    print(f"median, ours (trainer.pixels): {ours['cpu_s']:.2f} CPU-s, {ours['rss_mb']:.0f} MB")
    print(
        f"ratio ours/baseline: CPU {ours['cpu_s'] / base['cpu_s']:.2f}, "
        f"memory {ours['rss_mb'] / base['rss_mb']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
