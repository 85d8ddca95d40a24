"""Input pipeline throughput: JPEG files → normalised batches on the training device.

Generates an ImageNet-like folder (500x375 JPEGs of ~110 KB; ``--images``, 10 classes) once,
re-encodes a copy with ``python -m trainer.prepare`` (256 px short side), then measures each
pipeline on both copies:

* ``before``: the trainer's streamed path as it was, copied here as the named baseline: a list
  of ``Path`` objects, ``torch.manual_seed`` per sample, ``convert("RGB")`` copy, PILToTensor →
  RandomResizedCrop → RandomHorizontalFlip on the whole image;
* ``cpu``: today's ``--decode cpu`` (:class:`trainer.loader.DecodedImages`);
* ``gpu``: today's ``--decode gpu`` (:class:`trainer.loader.EncodedImages` in the workers,
  :class:`trainer.gpu_decode.GpuJpegDecoder` on the GPU), only where CUDA can decode JPEGs.

Two figures per pipeline:

* ``per core``: images/s of what one DataLoader worker does per image (read, decode or parse
  header, crop, collate), measured in this process on one thread. It sets how many cores a GPU
  needs: 5,000 images/s on one GPU needs 5,000 / (per-core figure) cores;
* ``end to end``: images/s from ``--workers`` DataLoader workers to normalised float batches on
  the device (GPU decoding included), the same as the trainer's ``StreamedImages``.

Printed as ratios against ``before`` in the same run; ``--json FILE`` writes everything.

    python benchmarks/input_pipeline.py                    # CPU here: small and quick
    python benchmarks/input_pipeline.py --images 4000 --batch-size 256 --workers 15  # a GPU node
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data import IMAGENET_MEAN, IMAGENET_STD, Normalizer, _v2  # noqa: E402
from trainer.gpu_decode import collate_encoded, gpu_decode_problem  # noqa: E402
from trainer.listing import load_splits  # noqa: E402
from trainer.loader import DecodedImages, EncodedImages, StreamedImages  # noqa: E402
from trainer.prepare import PrepareOptions, prepare  # noqa: E402
from trainer.randomness import derive_seed  # noqa: E402


# ------------------------------------------------------------------------- the data set
def _natural_like(rng: np.random.Generator, height: int, width: int, noise: float) -> np.ndarray:
    """Smooth shapes at several scales plus sensor-like noise: JPEG sizes like photographs."""
    pixels = np.zeros((height, width, 3), dtype=np.float32)
    for cells, weight in ((4, 120.0), (16, 50.0), (64, 25.0)):
        small = rng.uniform(-1, 1, (cells * height // width + 1, cells, 3)).astype(np.float32)
        layer = Image.fromarray(((small + 1) * 127.5).astype(np.uint8)).resize(
            (width, height), Image.Resampling.BICUBIC
        )
        pixels += (np.asarray(layer, dtype=np.float32) - 127.5) / 127.5 * weight
    pixels += 128 + rng.normal(0, noise, pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _jpeg_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _noise_for(target_bytes: int, rng: np.random.Generator) -> float:
    """The noise level whose 500x375 JPEG is about ``target_bytes`` (bisection)."""
    low, high = 0.0, 40.0
    for _ in range(8):
        middle = (low + high) / 2
        size = len(_jpeg_bytes(_natural_like(rng, 375, 500, middle)))
        low, high = (middle, high) if size < target_bytes else (low, middle)
    return (low + high) / 2


def _write_images(root: Path, indices: range, noise: float, seed: int) -> None:
    for index in indices:
        rng = np.random.default_rng([seed, index])
        height, width = (500, 375) if index % 5 == 4 else (375, 500)  # a few portraits
        folder = root / "train" / f"class_{index % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = _natural_like(rng, height, width, noise)
        (folder / f"{index:06d}.jpg").write_bytes(_jpeg_bytes(pixels))


def make_folder(root: Path, images: int, target_kb: int, workers: int, seed: int = 0) -> Path:
    """``root/train/class_k/*.jpg``: ``images`` 500x375 JPEGs of about ``target_kb`` each."""
    from concurrent.futures import ProcessPoolExecutor

    marker = root / ".complete"
    if marker.exists():
        return root
    noise = _noise_for(target_kb * 1000, np.random.default_rng(seed))
    chunks = [range(start, min(images, start + 100)) for start in range(0, images, 100)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_write_images, root, chunk, noise, seed) for chunk in chunks]
        for future in futures:
            future.result()
    marker.write_text("")
    return root


def _mean_kb(root: Path) -> float:
    sizes = [p.stat().st_size for p in (root / "train").rglob("*.jpg")]
    return sum(sizes) / len(sizes) / 1000


# ------------------------------------------------------------------- the baseline, as it was
def _old_load_image(path):
    with Image.open(path) as image:
        return image.convert("RGB")


def _old_transform(image_size: int):
    v2 = _v2()
    return v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    )


class OldFileDataset(torch.utils.data.Dataset):
    """The trainer's ``_FileDataset`` before this change (list of Paths, torch.manual_seed)."""

    def __init__(self, items: list[tuple[Path, int]], image_size: int, seed: int):
        self.items, self.image_size, self.seed = items, image_size, seed
        self._transform = None

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_transform": None}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key):
        index, epoch = key
        path, label = self.items[index]
        if self._transform is None:
            self._transform = _old_transform(self.image_size)
        torch.manual_seed(derive_seed(self.seed, "sample", epoch, index))
        return self._transform(_old_load_image(path)), label


# ------------------------------------------------------------------------------ measuring
def per_core(dataset, collate, count: int, batch_size: int) -> float:
    """images/s of the worker-side work for ``count`` images, on this one thread."""
    keys = [(i % len(dataset), 0) for i in range(count)]
    collate([dataset[k] for k in keys[:batch_size]])  # warm-up: imports, transforms, file cache
    started = time.perf_counter()
    for start in range(0, count, batch_size):
        collate([dataset[k] for k in keys[start : start + batch_size]])
    return count / (time.perf_counter() - started)


def end_to_end(kind: str, splits, args, device: torch.device) -> float:
    """images/s from ``args.workers`` DataLoader workers to normalised batches on ``device``."""
    normalize = Normalizer(IMAGENET_MEAN, IMAGENET_STD, device, channels_last=device.type == "cuda")
    common = dict(
        image_size=args.image_size,
        augment="crop-flip",
        batch_size=args.batch_size,
        rank=0,
        world_size=1,
        seed=0,
        num_workers=args.workers,
        normalize=normalize,
        prefetch_factor=4 if args.workers else None,
    )
    if kind == "before":
        batches = _old_source(splits, args, normalize)
    else:
        batches = StreamedImages(splits.train, splits.val, decode=kind, **common).epoch
    # Epoch 0 warms up (workers start, import torchvision, fill the page cache); epoch 1 counts.
    for _ in batches(0):
        pass
    if device.type == "cuda":
        torch.cuda.synchronize()
    seen, started = 0, time.perf_counter()
    for images, _ in batches(1):
        seen += images.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - started)


def _old_source(splits, args, normalize: Normalizer):
    """The old ``StreamedImages.epoch``: workers' uint8 batches normalised in this thread."""
    from trainer.loader import EpochBatchSampler

    sampler = EpochBatchSampler(len(splits.train), args.batch_size, 0, 1, 0)
    options: dict = {"num_workers": args.workers, "pin_memory": normalize.device.type == "cuda"}
    if args.workers:
        options |= {"persistent_workers": True, "prefetch_factor": 4}
        options["multiprocessing_context"] = "spawn"
    loader = torch.utils.data.DataLoader(
        OldFileDataset(splits.train.items(), args.image_size, seed=0),
        batch_sampler=sampler,
        **options,
    )

    def epoch(number: int):
        sampler.set_position(number, 0)
        for images, labels in loader:
            yield normalize(images), labels.to(normalize.device, non_blocking=True)

    return epoch


def datasets(kind: str, splits, image_size: int):
    if kind == "before":
        return OldFileDataset(splits.train.items(), image_size, 0), torch.utils.data.default_collate
    if kind == "cpu":
        return (
            DecodedImages(splits.train, image_size=image_size, augment="crop-flip", seed=0),
            torch.utils.data.default_collate,
        )
    return (
        EncodedImages(splits.train, image_size=image_size, augment="crop-flip", seed=0),
        collate_encoded,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1200, help="JPEGs to generate")
    parser.add_argument("--target-kb", type=int, default=110, help="mean JPEG size to aim for")
    parser.add_argument("--data", type=Path, help="keep the generated folders here (reused)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--per-core-images", type=int, default=512, help="images per figure")
    parser.add_argument("--rounds", type=int, default=3, help="per-core rounds; best kept")
    parser.add_argument("--workers", type=int, default=None, help="default: the usable CPUs")
    parser.add_argument("--skip-end-to-end", action="store_true")
    parser.add_argument("--skip-per-core", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from trainer.distributed import available_cpus

    if args.workers is None:
        args.workers = available_cpus()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    kinds = ["before", "cpu"]
    gpu_problem = gpu_decode_problem(device)
    if gpu_problem is None:
        kinds.append("gpu")
    else:
        print(f"[bench] no GPU decode here: {gpu_problem}", flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        base = args.data or Path(scratch)
        began = time.perf_counter()
        original = make_folder(base / "original", args.images, args.target_kb, args.workers)
        print(f"[bench] data set ready in {time.perf_counter() - began:.0f}s", flush=True)
        # All usable CPUs, as one would run it; its figure below is per core.
        report = prepare(PrepareOptions(source=original, destination=base / "reencoded"))
        reencoded = base / "reencoded"
        result: dict = {
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "usable_cpus": available_cpus(),
            "load_average": os.getloadavg(),
            "images": args.images,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "workers": args.workers,
            "mean_kb": {"original": _mean_kb(original), "reencoded": _mean_kb(reencoded)},
            "prepare_images_per_s_per_core": round(
                (report.reencoded + report.copied) / max(report.seconds, 1e-9) / available_cpus(),
                1,
            )
            if report.reencoded
            else None,
            "per_core": {},
            "end_to_end": {},
        }
        torch.set_num_threads(1)  # what a DataLoader worker runs with
        for copy, root in (("original", original), ("reencoded", reencoded)):
            splits = load_splits(root, val_fraction=0.01, seed=0)
            # Alternate the pipelines and keep each one's best round: on a shared machine the
            # load changes from second to second, and the best round is the least disturbed.
            for _ in range(0 if args.skip_per_core else args.rounds):
                for kind in kinds:
                    dataset, collate = datasets(kind, splits, args.image_size)
                    rate = per_core(dataset, collate, args.per_core_images, args.batch_size)
                    key = f"{kind}/{copy}"
                    result["per_core"][key] = round(max(rate, result["per_core"].get(key, 0)), 1)
                    print(f"[bench] per core   {kind:6s} {copy:9s} {rate:8.1f} img/s", flush=True)
            if args.skip_end_to_end:
                continue
            for kind in kinds:
                rate = end_to_end(kind, splits, args, device)
                result["end_to_end"][f"{kind}/{copy}"] = round(rate, 1)
                print(
                    f"[bench] end to end {kind:6s} {copy:9s} {rate:8.1f} img/s "
                    f"({args.workers} workers)",
                    flush=True,
                )
    _print_ratios(result, kinds)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _print_ratios(result: dict, kinds: list[str]) -> None:
    print(
        f"\ninput pipeline on {result['device']}, {result['usable_cpus']} usable CPUs, load "
        f"{result['load_average'][0]:.1f}; JPEGs {result['mean_kb']['original']:.0f} KB, "
        f"re-encoded {result['mean_kb']['reencoded']:.0f} KB; {result['image_size']} px crops"
    )
    if result["prepare_images_per_s_per_core"]:
        print(f"trainer.prepare: {result['prepare_images_per_s_per_core']} images/s per core")
    for figure in ("per_core", "end_to_end"):
        rates = result[figure]
        if not rates:
            continue
        base = rates["before/original"]
        print(f"{figure.replace('_', ' ')} (images/s; ratio to before/original):")
        for key, rate in rates.items():
            print(f"  {key:20s} {rate:9.1f}  x{rate / base:5.2f}")
        for copy in ("original", "reencoded"):
            if "gpu" in kinds:
                ratio = rates[f"gpu/{copy}"] / rates[f"cpu/{copy}"]
                print(f"  gpu vs cpu decode ({copy}): x{ratio:.2f}")
        ratio = rates["cpu/reencoded"] / rates["cpu/original"]
        print(f"  re-encoded vs original (cpu decode): x{ratio:.2f}")


if __name__ == "__main__":
    sys.exit(main())
