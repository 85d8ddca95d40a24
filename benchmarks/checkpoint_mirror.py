"""What mirroring checkpoints to S3 (``--checkpoint-uri``) costs training, and how long a
checkpoint takes to become durable there.

The real trainer (``python -m trainer.train``, one process, synthetic data) runs the same steps
twice per round — side by side (each on its own core, one thread each) unless
``--one-at-a-time`` — so that a shared machine's load falls on both alike:

* ``local``: checkpoints to its output folder only (the baseline);
* ``mirrored``: the same, plus ``--checkpoint-uri`` on a local SeaweedFS server (started here):
  rank 0 uploads each complete ``step-N/`` in the background, its marker last, and prunes to
  ``--keep-checkpoints``.

``--control`` runs both without the mirror: the ratio's noise floor on this machine.
Printed per round: each run's training time (the trainer's ``train_time_s``, which excludes
start-up and the final wait for the last upload) and the ratio mirrored / local; then the median
ratio and, from the trainer's own log lines, the median seconds from a checkpoint's save to its
marker being in S3 ("durable") and the upload time. The default interval is the trainer's
(500 steps); ``--every 25`` shows the cost when checkpoints come every second or two.

    python benchmarks/checkpoint_mirror.py
    python benchmarks/checkpoint_mirror.py --model resnet50 --image-size 224 --batch-size 256 \\
        --steps 1500 --every 500   # the default interval, a ResNet-50's ~195 MiB state (a GPU node)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kfp_ddp.local_s3 import LocalS3Server  # noqa: E402

DURABLE_RE = re.compile(r"is durable in \S+ \((\d+\.\d+)s after its save; upload (\d+\.\d+)s\)")


@dataclass(frozen=True)
class Run:
    train_s: float
    durable_s: list[float]
    upload_s: list[float]


def train(args: argparse.Namespace, out: Path, env: dict[str, str], uri: str | None) -> Run:
    command = [sys.executable, "-m", "trainer.train", "--synthetic", "--output-dir", str(out)]
    command += ["--model", args.model, "--image-size", str(args.image_size)]
    command += ["--batch-size", str(args.batch_size), "--max-steps", str(args.steps)]
    command += ["--synthetic-size", str(args.batch_size * args.steps), "--epochs", "1"]
    command += ["--checkpoint-every-steps", str(args.every), "--keep-checkpoints", "2"]
    command += ["--log-interval", "1000000", "--num-classes", "10"]
    if uri:
        command += ["--checkpoint-uri", uri]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr}")
    summary = json.loads((out / "summary.json").read_text())
    found = DURABLE_RE.findall(proc.stdout + proc.stderr)
    if uri and not found:
        sys.exit(f"no checkpoint was reported durable in S3:\n{proc.stdout[-3000:]}")
    return Run(
        train_s=float(summary["train_time_s"]),
        durable_s=[float(d) for d, _ in found],
        upload_s=[float(u) for _, u in found],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument(
        "--every", type=int, default=500, help="--checkpoint-every-steps (the trainer's default)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of the trainer (1: on a shared CPU spinning OpenMP threads make a "
        "run up to ~50x slower and the ratio noise; 0: torch's default)",
    )
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="run the two trainers of a round one after the other (default: side by side, so "
        "that a shared machine's load hits both alike; needs 2 free cores)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="an A/A run: both trainers without --checkpoint-uri (the noise floor of the ratio)",
    )
    args = parser.parse_args()
    print(
        f"{args.model} {args.image_size}px batch {args.batch_size}, {args.steps} steps, a "
        f"checkpoint every {args.every} steps, {args.rounds} rounds, OMP_NUM_THREADS "
        f"{args.threads or 'default'}, {os.cpu_count()} CPUs"
    )
    ratios: list[float] = []
    durable: list[float] = []
    upload: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, LocalS3Server(data_dir=Path(tmp) / "s3") as s3:
        bucket = s3.create_bucket("bench-mirror")
        env = {**os.environ, **s3.env()}
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        for round_ in range(args.rounds):
            order = ["local", "mirrored"] if round_ % 2 == 0 else ["mirrored", "local"]

            def one(mode: str, round_: int = round_) -> Run:
                out = Path(tmp) / f"{mode}-{round_}"
                mirrored = mode == "mirrored" and not args.control
                uri = f"s3://{bucket}/round-{round_}/checkpoints" if mirrored else None
                return train(args, out, env, uri)

            workers = 1 if args.one_at_a_time else 2
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                runs = dict(zip(order, pool.map(one, order), strict=True))
            for mode in order:
                print(f"  round {round_ + 1} {mode:>8}: train {runs[mode].train_s:7.2f}s")
            ratio = runs["mirrored"].train_s / runs["local"].train_s
            ratios.append(ratio)
            durable += runs["mirrored"].durable_s
            upload += runs["mirrored"].upload_s
            print(f"  round {round_ + 1} mirrored / local = {ratio:.3f}")
    print(
        f"median training time mirrored / local = {statistics.median(ratios):.3f} "
        f"({(statistics.median(ratios) - 1) * 100:+.1f}%; target <= +1% at the default interval)"
    )
    print(f"rounds' spread: {min(ratios):.3f} .. {max(ratios):.3f}")
    if durable:
        print(
            f"checkpoint durable in S3 after its save: median {statistics.median(durable):.2f}s "
            f"(upload {statistics.median(upload):.2f}s), {len(durable)} checkpoints"
        )


if __name__ == "__main__":
    main()
