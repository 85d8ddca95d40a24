"""What ``--metrics-port`` costs: training throughput without metrics vs. with the endpoint scraped
every second (target: at most 1% slower).

1. End to end: the same small CPU run (synthetic data, ``--tensorboard-dir none`` in both) is
   started afresh for each measurement, alternating off / on for ``--rounds`` rounds so that a
   drift of the machine hits both alike; while a run with metrics trains, a thread of this script
   scrapes its endpoint every second, as Prometheus would. Throughput is read from the run's
   metrics.jsonl windows after a warm-up window. Prints each run, the medians and their ratio.
   The default model is tiny (many short steps: the worst case for a per-step cost).
2. Directly: the recorder's per-step calls and one scrape's rendering, timed in this process,
   against the step time of the runs: a cross-check that does not drown in the noise of a
   shared machine.

    python benchmarks/metrics_overhead.py                      # ~3 minutes on 2 cores
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


def train(args: argparse.Namespace, out: Path, *, metrics: bool) -> tuple[float, int]:
    """(images/s after the warm-up window, scrapes answered) of one fresh trainer process."""
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
    env = os.environ | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
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
    return throughput(out / "metrics.jsonl", args.batch_size), scraper.scrapes if scraper else 0


def throughput(metrics_jsonl: Path, batch_size: int) -> float:
    """images/s over the windows after the first (the warm-up)."""
    records = [json.loads(line) for line in metrics_jsonl.read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    timed = train[1:]
    steps = [b["step"] - a["step"] for a, b in zip(train, timed, strict=False)]
    seconds = sum(n * batch_size / r["images_per_sec"] for n, r in zip(steps, timed, strict=True))
    return sum(steps) * batch_size / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=50, help="steps per window; one untimed")
    parser.add_argument("--steps", type=int, default=400, help="timed steps per run")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    args.steps = max(args.warmup, args.steps // args.warmup * args.warmup)
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="metrics-overhead-") as tmp:
        for round_ in range(args.rounds):
            for metrics in (False, True):
                out = Path(tmp) / f"run-{round_}-{'on' if metrics else 'off'}"
                started = time.perf_counter()
                rate, scrapes = train(args, out, metrics=metrics)
                rates[metrics].append(rate)
                what = f"metrics on, {scrapes} scrapes" if metrics else "metrics off"
                print(
                    f"round {round_ + 1}: {what:<26} {rate:8.1f} images/s "
                    f"({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(
        f"{args.model} {args.image_size}px batch {args.batch_size} on {args.device}, "
        f"{args.steps} timed steps, median of {args.rounds}:"
    )
    print(f"  without metrics:            {off:8.1f} images/s")
    print(f"  with metrics, scraped 1/s:  {on:8.1f} images/s")
    print(f"  ratio on/off: {on / off:.4f} (cost {100 * (1 - on / off):+.2f}%; target <= 1%)")
    per_step, per_scrape = direct_costs()
    step_s = args.batch_size / off
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
