"""Training throughput (images/s, all processes): our trainer vs the seed guide's loop as written.

Every measurement runs in its own, fresh process (or torchrun group), so nothing (cuDNN
benchmark mode, TF32, threads) leaks from one into the other:

* baseline — the seed guide's loop as written: torchvision ``FakeData`` (synthetic) or
  ``ImageFolder`` with RandomResizedCrop/flip (JPEG folder) → ``ToTensor`` → ``DataLoader(batch 32,
  4 workers, pin_memory)`` → fp32 model in the default memory format, DDP over N processes;
* ours — ``python -m trainer.train`` (``--synthetic``, or ``--data-dir`` streaming the JPEG folder)
  with this script's model, batch, precision and channels_last, measured from its metrics.jsonl
  windows after a warm-up window.

Both on synthetic data and on a generated JPEG folder (500x375 images, ImageNet-like sizes), with
1 and N processes (N: the GPUs here, or 2 on the CPU). Prints one line per case with the ratio.

    python benchmarks/trainer_throughput.py                                  # CPU, small
    python benchmarks/trainer_throughput.py --model resnet50 --batch-size 256 --image-size 224 \\
        --precision bf16 --channels-last --steps 60 --warmup 20              # GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GUIDE_BATCH = 32
GUIDE_WORKERS = 4


# ---------------------------------------------------------------------- the seed guide's loop
def guide_loop(args: argparse.Namespace) -> None:
    """The seed guide's DDP loop, as written (run by torchrun or alone); rank 0 prints RESULT."""
    import torch
    import torch.distributed as dist

    from trainer.tv_compat import import_torchvision

    tv = import_torchvision()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(device)
    total = args.warmup + args.steps
    dataset = guide_dataset(args, total * GUIDE_BATCH * world)
    sampler = torch.utils.data.DistributedSampler(dataset) if world > 1 else None
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=GUIDE_BATCH,
        shuffle=sampler is None,
        sampler=sampler,
        num_workers=GUIDE_WORKERS,
        pin_memory=True,
        drop_last=True,
    )
    model = tv.models.get_model(args.model, num_classes=1000).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local_rank] if cuda else None
        )
    seconds = guide_train(model, loader, sampler, device, args)
    if rank == 0:
        rate = args.steps * GUIDE_BATCH * world / seconds
        print("RESULT " + json.dumps({"images_per_sec": rate}), flush=True)
    if world > 1:
        dist.destroy_process_group()


def guide_train(model, loader, sampler, device, args: argparse.Namespace) -> float:
    """The guide's loop: seconds for ``args.steps`` steps after ``args.warmup`` untimed ones."""
    import torch

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    model.train()
    total = args.warmup + args.steps
    done, started, epoch = 0, time.perf_counter(), 0
    while done < total:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for images, labels in loader:
            if done == args.warmup:
                sync()
                started = time.perf_counter()
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done == total:
                break
        epoch += 1
    sync()
    return time.perf_counter() - started


def guide_dataset(args: argparse.Namespace, size: int):
    """The guide's data: ImageFolder with its ImageNet transforms, or FakeData → ToTensor."""
    from trainer.tv_compat import import_torchvision

    tv = import_torchvision()
    from torchvision import transforms

    if not args.data_dir:
        return tv.datasets.FakeData(
            size=size,
            image_size=(3, args.image_size, args.image_size),
            num_classes=1000,
            transform=transforms.ToTensor(),
        )
    return tv.datasets.ImageFolder(
        args.data_dir,
        transform=transforms.Compose(
            [
                transforms.RandomResizedCrop(args.image_size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
            ]
        ),
    )


# ----------------------------------------------------------------------------- running cases
def launch(module_args: list[str], procs: int, timeout: float) -> subprocess.CompletedProcess:
    """``python -m ...`` alone, or under torchrun with ``procs`` processes (fresh processes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    head = [sys.executable]
    if procs > 1:
        head += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
    result = subprocess.run(
        [*head, *module_args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(module_args[:3])} failed:\n{result.stdout}\n{result.stderr}")
    return result


def run_guide(args: argparse.Namespace, data_dir: Path | None, procs: int) -> float:
    command = [str(Path(__file__).resolve()), "--role", "guide"]
    command += ["--model", args.model, "--image-size", str(args.image_size)]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device]
    if data_dir:
        command += ["--data-dir", str(data_dir)]
    result = launch(command, procs, args.timeout)
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))["images_per_sec"]


def run_ours(args: argparse.Namespace, data_dir: Path | None, procs: int, out: Path) -> float:
    """images/s of ``python -m trainer.train``, from its metrics.jsonl after the first window."""
    windows = -(-args.steps // args.warmup)  # timed windows of `warmup` steps each
    command = ["-m", "trainer.train", "--output-dir", str(out), "--model", args.model]
    command += ["--batch-size", str(args.batch_size), "--image-size", str(args.image_size)]
    command += ["--precision", args.precision, "--device", args.device]
    command += ["--max-steps", str(args.warmup * (windows + 1)), "--epochs", "1000"]
    command += ["--log-interval", str(args.warmup), "--checkpoint-every-steps", "0"]
    command += ["--channels-last" if args.channels_last else "--no-channels-last"]
    command += ["--compile" if args.compile else "--no-compile"]
    if data_dir:
        command += ["--data-dir", str(data_dir), "--cache-images", "never"]
    else:
        command += ["--synthetic", "--num-classes", "1000", "--synthetic-size", str(10**9)]
    launch(command, procs, args.timeout)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    timed = train[1:]  # the first window is the warm-up
    steps = [b["step"] - a["step"] for a, b in zip(train, timed, strict=False)]
    global_batch = args.batch_size * procs
    seconds = sum(n * global_batch / r["images_per_sec"] for n, r in zip(steps, timed, strict=True))
    return sum(steps) * global_batch / seconds


def write_jpeg_folder(root: Path, *, images: int, classes: int = 10, seed: int = 0) -> Path:
    """ImageNet-like JPEGs: 500x375, smooth content with some noise (~100 KB at quality 90).

    Written by a process per core (each image from its own seed, so the folder is the same
    whatever the core count).
    """
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(root / "train", i, classes, seed) for i in range(images)]
    jobs += [(root / "val", i, classes, seed + 1) for i in range(classes)]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(_write_jpeg, jobs, chunksize=64))
    return root


def _write_jpeg(job: tuple[Path, int, int, int]) -> None:
    import numpy as np
    from PIL import Image

    split, i, classes, seed = job
    rng = np.random.default_rng([seed, i])
    folder = split / f"class_{i % classes:03d}"
    folder.mkdir(parents=True, exist_ok=True)
    coarse = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
    picture = Image.fromarray(coarse).resize((500, 375), Image.BICUBIC)
    pixels = np.asarray(picture, dtype=np.int16)
    pixels = pixels + rng.integers(-12, 13, size=pixels.shape, dtype=np.int16)
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i:06d}.jpg", quality=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("compare", "guide"), default="compare")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32, help="ours (the guide's is 32)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    parser.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ours (default: on with CUDA, off on CPU)",
    )
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--procs", default=None, help="e.g. 1,2 (default: 1 and N)")
    parser.add_argument("--data", default="synthetic,jpeg", help="synthetic, jpeg or both")
    parser.add_argument("--jpeg-images", type=int, default=None, help="default: enough for a run")
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)  # the guide's, internal
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.role == "guide":
        guide_loop(args)
        return 0
    return compare(args)


def compare(args: argparse.Namespace) -> int:
    import torch

    cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.channels_last is None:
        args.channels_last = cuda
    many = torch.cuda.device_count() if cuda else 2
    procs = [int(p) for p in args.procs.split(",")] if args.procs else sorted({1, many})
    sources = args.data.split(",")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = None
        if "jpeg" in sources:
            needed = (args.warmup * 2 + args.steps) * max(args.batch_size, GUIDE_BATCH) * max(procs)
            count = args.jpeg_images or min(needed, 4096)  # more: repeated epochs
            folder = write_jpeg_folder(Path(tmp) / "jpeg", images=count)
        for source in sources:
            data_dir = folder if source == "jpeg" else None
            for n in procs:
                guide = run_guide(args, data_dir, n)
                ours = run_ours(args, data_dir, n, Path(tmp) / f"out-{source}-{n}")
                ratio = ours / guide
                results.append({"data": source, "procs": n, "guide": guide, "ours": ours})
                results[-1]["ratio"] = ratio
                print(
                    f"{source:9} x{n}: ours {ours:9,.1f} img/s | seed guide's loop {guide:9,.1f} "
                    f"img/s | ratio {ratio:5.2f}x",
                    flush=True,
                )
    summary = {
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "model": args.model,
        "batch_size": args.batch_size,
        "guide_batch_size": GUIDE_BATCH,
        "image_size": args.image_size,
        "precision": args.precision,
        "channels_last": args.channels_last,
        "compile": args.compile,
        "steps": args.steps,
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
