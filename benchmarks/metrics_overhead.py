"""What ``--metrics-port`` costs: training throughput without metrics vs. with the endpoint scraped
every second (target: at most 1% slower).

1. End to end: the same small CPU run (synthetic data, ``--tensorboard-dir none``), once without
   and once with ``--metrics-port``, side by side in each round (fresh processes, one thread
   each: on 2 cores they do not compete, and whatever else loads the machine hits both alike);
   a thread of this script scrapes the endpoint every second, as Prometheus would. Throughput is
   read from the runs' metrics.jsonl windows after a warm-up window. Prints each round's ratio,
   the median throughputs and the median ratio. The default model is tiny (many short steps: the
   worst case for a per-step cost).
2. Directly: the recorder's per-step calls and one scrape's rendering, timed in this process,
   against the step time of the runs: a cross-check that does not drown in the noise of a
   shared machine.

    python benchmarks/metrics_overhead.py                      # ~2 minutes on 2 cores
    python benchmarks/metrics_overhead.py --rounds 5 --model resnet50 --image-size 224 \
        --batch-size 64 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class Scraper(threading.Thread):
    """GET /metrics every ``interval`` seconds until stopped; counts the answers."""

    def __init__(self, port: int, interval: float = 1.0):
        super().__init__(daemon=True)
        self.url, self.interval = f"http://127.0.0.1:{port}/metrics", interval
        self.stopped = threading.Event()
        self.scrapes = 0
        self.bytes = 0

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    self.bytes += len(answer.read())
                self.scrapes += 1
            except OSError:
                pass  # not listening yet (start-up) or gone (the end)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Measured:
    """One run: images/s over its timed windows, in its fastest window, and scrapes answered."""

    mean: float
    best: float
    scrapes: int


def train(args: argparse.Namespace, out: Path, *, metrics: bool) -> Measured:
    """One fresh trainer process, its windows after the warm-up one."""
    command = [sys.executable, "-m", "trainer.train", "--output-dir", str(out)]
    command += ["--synthetic", "--synthetic-size", str(10**9), "--num-classes", "100"]
    command += ["--model", args.model, "--image-size", str(args.image_size)]
    command += ["--batch-size", str(args.batch_size), "--device", args.device, "--epochs", "1"]
    command += ["--max-steps", str(args.warmup + args.steps), "--log-interval", str(args.warmup)]
    command += ["--checkpoint-every-steps", "0", "--tensorboard-dir", "none"]
    scraper = None
    if metrics:
        port = free_port()
        command += ["--metrics-port", str(port), "--metrics-job", "bench"]
        scraper = Scraper(port)
        scraper.start()
    env = os.environ | {
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        # Few threads ride out other work on a shared machine (spinning OpenMP threads do not).
        "OMP_NUM_THREADS": str(args.threads),
    }
    try:
        result = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout
        )
    finally:
        if scraper is not None:
            scraper.stopped.set()
            scraper.join()
    if result.returncode != 0:
        raise SystemExit(f"the trainer failed:\n{result.stdout}\n{result.stderr}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    timed = train[1:]  # the first window is the warm-up
    steps = [b["step"] - a["step"] for a, b in zip(train, timed, strict=False)]
    images = [n * args.batch_size for n in steps]
    seconds = sum(n / r["images_per_sec"] for n, r in zip(images, timed, strict=True))
    return Measured(
        mean=sum(images) / seconds,
        best=max(r["images_per_sec"] for r in timed),
        scrapes=scraper.scrapes if scraper else 0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=50, help="steps per window; one untimed")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the trainer")
    parser.add_argument(
        "--control",
        action="store_true",
        help="both runs without metrics (an A/A test: the noise floor of the ratio here)",
    )
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    args.steps = max(args.warmup, args.steps // args.warmup * args.warmup)
    runs: dict[bool, list[Measured]] = {False: [], True: []}
    ratios = []
    with tempfile.TemporaryDirectory(prefix="metrics-overhead-") as tmp:
        for round_ in range(args.rounds):
            started = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:  # side by side: the same load hits both
                pending = {
                    on: pool.submit(
                        train,
                        args,
                        Path(tmp) / f"run-{round_}-{on}",
                        metrics=on and not args.control,
                    )
                    for on in (False, True)
                }
            off, on = pending[False].result(), pending[True].result()
            runs[False].append(off)
            runs[True].append(on)
            ratios.append(on.mean / off.mean)
            print(
                f"round {round_ + 1}: off {off.mean:7.1f} images/s, on {on.mean:7.1f} "
                f"({on.scrapes} scrapes): ratio {ratios[-1]:.4f} "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    print(
        f"{args.model} {args.image_size}px batch {args.batch_size} on {args.device}, "
        f"{args.threads} thread(s) each, {args.steps} timed steps, {args.rounds} rounds:"
    )
    off = statistics.median(r.mean for r in runs[False])
    on = statistics.median(r.mean for r in runs[True])
    ratio = statistics.median(ratios)
    print(f"  {'without metrics:':<33} {off:8.1f} images/s (median)")
    second = "again without metrics (--control)" if args.control else "with metrics, scraped 1/s"
    print(f"  {second + ':':<33} {on:8.1f} images/s (median)")
    cost = 100 * (1 - ratio)
    spread = f"{min(ratios):.4f}..{max(ratios):.4f}"
    print(f"  ratio (median of rounds): {ratio:.4f}: cost {cost:+.2f}% (target <= 1%); {spread}")
    fastest = statistics.median(r.best for r in runs[False])
    per_step, per_scrape = direct_costs()
    step_s = args.batch_size / fastest  # the shortest steps: the largest share
    share = (per_step / step_s + per_scrape / 1.0) * 100
    print(
        f"  direct: {per_step * 1e6:.1f} us of recorder calls per step, {per_scrape * 1e3:.2f} ms "
        f"per scrape; against a {step_s * 1e3:.1f} ms step and a scrape a second: {share:.3f}%"
    )


def direct_costs(steps: int = 20_000, scrapes: int = 200) -> tuple[float, float]:
    """(seconds of recorder calls per step, seconds to render one scrape), in this process."""
    import torch
    from prometheus_client import generate_latest

    from trainer.distributed import DistEnv
    from trainer.metrics import MetricsRecorder

    cpu = torch.device("cpu")
    recorder = MetricsRecorder(port=free_port(), env=DistEnv(), job="bench", device=cpu)
    try:
        recorder.loop_started(step=0, epoch=0, total_steps=steps, restarts=0, resumed_from=None)
        started = time.perf_counter()
        for step in range(1, steps + 1):
            recorder.batch_ready(0.001)
            recorder.step_done(step=step, epoch=0, images=16, compute_s=0.01)
            if step % 50 == 0:
                recorder.window_logged(loss=1.0, lr=0.1, images_per_sec=100.0)
        per_step = (time.perf_counter() - started) / steps
        started = time.perf_counter()
        for _ in range(scrapes):
            generate_latest(recorder.registry)
        per_scrape = (time.perf_counter() - started) / scrapes
    finally:
        recorder.close()
    return per_step, per_scrape


if __name__ == "__main__":
    main()
