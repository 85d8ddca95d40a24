"""``--decode gpu`` stage by stage: how many images/s each stage of the GPU JPEG path can feed.

The trainer's JPEG path on a GPU (:mod:`trainer.gpu_decode`, :class:`trainer.loader.StreamedImages`)
has four stages; here each runs alone on the same batches of a generated ImageNet-like folder
(500x375 JPEGs, ``--images``), so the slowest one names the limit of the whole path:

* ``worker`` — what a DataLoader worker does per image (read, parse the header, draw the window,
  collate), on one core: multiply by the workers for the path's CPU side;
* ``decode`` — nvJPEG on the batch (``GpuJpegDecoder.decode``; on the CPU, PIL stands in);
* ``crop`` — today's crop, resize and flip (``GpuJpegDecoder.crop``) against ``crop-before``, the
  crop as it was (a round, clamp and copy per image; copied here as the named baseline);
* ``normalise`` — uint8 → normalised float, channels_last (the last stage).

Each figure is wall time over ``--batches`` batches after one untimed batch, the device
synchronised at both ends, beside the time the calls took to return before the last
synchronisation (``issued``: a stage whose issue time is close to its wall time is bound by this
Python thread's kernel launches, not by the GPU).

    python benchmarks/gpu_decode_stages.py --device cpu --images 64 --batch-size 16 --batches 2
    python benchmarks/gpu_decode_stages.py --json stages.json        # a GPU node
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trainer_throughput import write_jpeg_folder  # noqa: E402
from trainer.data import IMAGENET_MEAN, IMAGENET_STD, Normalizer  # noqa: E402
from trainer.gpu_decode import (  # noqa: E402
    DecodedJpegs,
    EncodedBatch,
    GpuJpegDecoder,
    collate_encoded,
)
from trainer.listing import scan_split  # noqa: E402
from trainer.loader import EncodedImages  # noqa: E402


def crop_before(decoder: GpuJpegDecoder, decoded: DecodedJpegs) -> torch.Tensor:
    """The crop stage as it was before this benchmark (the named baseline)."""
    size = decoder.image_size
    images, windows = decoded.images, decoded.windows
    out = torch.empty(len(images), 3, size, size, dtype=torch.uint8, device=decoder.device)
    for i, (image, window) in enumerate(zip(images, windows.tolist(), strict=True)):
        top, left, height, width, _ = window
        crop = image[:, top : top + height, left : left + width].unsqueeze(0).float()
        resized = torch.nn.functional.interpolate(
            crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[i] = resized[0].round_().clamp_(0, 255)
    flips = windows[:, 4].to(decoder.device, non_blocking=True).bool()
    return torch.where(flips.view(-1, 1, 1, 1), out.flip(-1), out)


def pil_decode(batch: EncodedBatch) -> DecodedJpegs:
    """The CPU stand-in for nvJPEG (so the script runs, and is tested, without a GPU)."""
    import io

    import numpy as np
    from PIL import Image

    images = []
    for payload in batch.payloads():
        with Image.open(io.BytesIO(payload.numpy().tobytes())) as image:
            pixels = np.array(image.convert("RGB"))
        images.append(torch.from_numpy(pixels).permute(2, 0, 1))
    return DecodedJpegs(images, batch.windows, batch.labels)


def timed(stage, inputs: list, device: torch.device) -> tuple[list, float, float]:
    """Outputs, wall seconds, and seconds until the last call returned (before the final device
    synchronisation: the time this thread spent issuing work) of ``stage`` over ``inputs[1:]``."""
    outputs = [stage(inputs[0])]
    _sync(device)
    began = time.perf_counter()
    outputs += [stage(item) for item in inputs[1:]]
    issued = time.perf_counter() - began
    _sync(device)
    return outputs, time.perf_counter() - began, issued


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2304, help="JPEGs to generate")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per stage")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    count = (args.batches + 1) * args.batch_size
    if args.images < count:
        raise SystemExit(f"--images {args.images}: needs at least (batches + 1) x batch = {count}")
    with tempfile.TemporaryDirectory() as tmp:
        listing = scan_split(write_jpeg_folder(Path(tmp), images=args.images) / "train")
        source = EncodedImages(listing, image_size=args.image_size, augment="crop-flip", seed=0)
        keys = [
            [(i, 0) for i in range(b * args.batch_size, (b + 1) * args.batch_size)]
            for b in range(args.batches + 1)
        ]
        batches, worker_wall, worker_issued = timed(
            lambda k: collate_encoded([source[key] for key in k]), keys, torch.device("cpu")
        )
    decoder = GpuJpegDecoder(device, args.image_size)
    decoded, decode_wall, decode_issued = timed(
        decoder.decode if cuda else pil_decode, batches, device
    )
    cropped, crop_wall, crop_issued = timed(decoder.crop, decoded, device)
    before, before_wall, before_issued = timed(lambda d: crop_before(decoder, d), decoded, device)
    identical = all(torch.equal(a, b) for a, b in zip(cropped, before, strict=True))
    normalize = Normalizer(IMAGENET_MEAN, IMAGENET_STD, device, channels_last=cuda)
    _, norm_wall, norm_issued = timed(normalize, cropped, device)
    images = args.batches * args.batch_size
    stages = {
        "worker (one core)": (worker_wall, worker_issued),
        "decode": (decode_wall, decode_issued),
        "crop-before": (before_wall, before_issued),
        "crop": (crop_wall, crop_issued),
        "normalise": (norm_wall, norm_issued),
    }
    card = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"{card}, torch {torch.__version__}, batch {args.batch_size}, {args.image_size} px")
    results = {}
    for name, (wall, issued) in stages.items():
        results[name] = {
            "images_per_sec": images / wall,
            "ms_per_batch": 1000 * wall / args.batches,
            "issued_ms_per_batch": 1000 * issued / args.batches,
        }
        print(
            f"{name:18} {images / wall:10,.0f} img/s  {1000 * wall / args.batches:8.1f} ms/batch"
            f"  (issued in {1000 * issued / args.batches:7.1f} ms/batch)"
        )
    ratio = before_wall / crop_wall
    print(f"crop / crop-before: {ratio:.2f}x the rate; the same pixels: {identical}")
    if args.json:
        summary = {**vars(args), "json": str(args.json), "card": card, "torch": torch.__version__}
        summary.update(results=results, crop_ratio=ratio, crop_identical=identical)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
