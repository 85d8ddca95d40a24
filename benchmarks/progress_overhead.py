"""What the progress reports to Kubeflow Trainer cost: training throughput without them vs. with
them sent to a local HTTPS endpoint (target: at most 1% slower).

1. End to end: the same small CPU run (synthetic data, ``--tensorboard-dir none``), once without
   the ``KUBEFLOW_TRAINER_SERVER_*`` variables and once with them pointing at a stand-in status
   server in this process (TLS with a throw-away CA, answering 200 as the real one does), side by
   side in each round (fresh processes, one thread each; whatever else loads the machine hits
   both alike). By default a report goes out at the shortest interval allowed (1 s, the worst
   case; the trainer's default is 30 s) and a log window, whose figures a report carries, ends
   every 10 steps. Throughput is read from the runs' metrics.jsonl windows after the warm-up.
   Prints each round's ratio, the median throughputs and the median ratio; ``--control`` runs
   both without reports (an A/A test: the noise floor of the ratio on this machine).
2. Directly: the training thread's part (one ``update()`` and ``offer()`` per log window) and one
   report's wall time on the reporter's thread, timed in this process, against the step time of
   the runs.

    python benchmarks/progress_overhead.py                 # ~3 minutes on 2 cores
    python benchmarks/progress_overhead.py --control
    python benchmarks/progress_overhead.py --interval 30 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.certs import CertificateAuthority  # noqa: E402
from tests.trainer.trainjob_status_server import StatusServer, answering  # noqa: E402
from trainer.progress import ProgressTracker  # noqa: E402
from trainer.trainjob_status import (  # noqa: E402
    CA_CERT_VARIABLE,
    TOKEN_VARIABLE,
    URL_VARIABLE,
    StatusEndpoint,
    StatusReporter,
    post_status,
)


@dataclass(frozen=True)
class Endpoint:
    """The stand-in server and the files a trainer container would be given."""

    server: StatusServer
    ca_file: Path
    token_file: Path

    def variables(self) -> dict[str, str]:
        return {
            URL_VARIABLE: self.server.url("bench", "progress"),
            CA_CERT_VARIABLE: str(self.ca_file),
            TOKEN_VARIABLE: str(self.token_file),
        }


@dataclass(frozen=True)
class Measured:
    """One run: images/s over its timed windows, and in its fastest window."""

    mean: float
    best: float


def train(args: argparse.Namespace, out: Path, endpoint: Endpoint | None) -> Measured:
    """One fresh trainer process, its windows after the warm-up."""
    command = [sys.executable, "-m", "trainer.train", "--output-dir", str(out)]
    command += ["--synthetic", "--synthetic-size", str(10**9), "--num-classes", "100"]
    command += ["--model", args.model, "--image-size", str(args.image_size)]
    command += ["--batch-size", str(args.batch_size), "--device", args.device, "--epochs", "1"]
    command += ["--max-steps", str(args.warmup + args.steps), "--log-interval", str(args.window)]
    command += ["--checkpoint-every-steps", "0", "--tensorboard-dir", "none"]
    command += ["--progress-report-interval-s", str(args.interval)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEFLOW_TRAINER_")}
    env |= {
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        # Few threads ride out other work on a shared machine (spinning OpenMP threads do not).
        "OMP_NUM_THREADS": str(args.threads),
    }
    if endpoint is not None:
        env |= endpoint.variables()
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout
    )
    if result.returncode != 0:
        raise SystemExit(f"the trainer failed:\n{result.stdout}\n{result.stderr}")
    if endpoint is not None and "WARNING" in result.stdout:
        raise SystemExit(f"reports did not go through:\n{result.stdout}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if r["type"] == "train" and r["step"] > args.warmup]
    seconds = sum(args.window * args.batch_size / r["images_per_sec"] for r in timed)
    return Measured(
        mean=len(timed) * args.window * args.batch_size / seconds,
        best=max(r["images_per_sec"] for r in timed),
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=50, help="untimed steps at the start")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--window", type=int, default=10, help="--log-interval of the runs")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="--progress-report-interval-s (min 1)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the trainer")
    parser.add_argument(
        "--control",
        action="store_true",
        help="both runs without reports (an A/A test: the noise floor of the ratio here)",
    )
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    args.warmup = max(args.window, args.warmup // args.window * args.window)
    args.steps = max(args.window, args.steps // args.window * args.window)
    return args


def main() -> None:
    args = parse_args()
    runs: dict[bool, list[Measured]] = {False: [], True: []}
    ratios, received = [], []
    with tempfile.TemporaryDirectory(prefix="progress-overhead-") as tmp:
        folder = Path(tmp)
        ca = CertificateAuthority()
        ca.pem.write(folder / "ca", "ca.crt", "ca.key")
        (folder / "token").write_text("a-projected-token\n")
        with StatusServer(folder / "server", ca, answering(200)) as server:
            endpoint = Endpoint(server, folder / "ca" / "ca.crt", folder / "token")
            for round_ in range(args.rounds):
                started, before = time.perf_counter(), len(server.requests)
                with ThreadPoolExecutor(2) as pool:  # side by side: the same load hits both
                    pending = {
                        on: pool.submit(
                            train,
                            args,
                            folder / f"run-{round_}-{on}",
                            endpoint if on and not args.control else None,
                        )
                        for on in (False, True)
                    }
                off, on = pending[False].result(), pending[True].result()
                runs[False].append(off)
                runs[True].append(on)
                ratios.append(on.mean / off.mean)
                received.append(len(server.requests) - before)
                print(
                    f"round {round_ + 1}: off {off.mean:7.1f} images/s, on {on.mean:7.1f} "
                    f"({received[-1]} reports): ratio {ratios[-1]:.4f} "
                    f"({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
            costs = direct_costs(endpoint, folder)
    report(args, runs, ratios, costs)


def report(
    args: argparse.Namespace,
    runs: dict[bool, list[Measured]],
    ratios: list[float],
    costs: DirectCosts,
) -> None:
    print(
        f"{args.model} {args.image_size}px batch {args.batch_size} on {args.device}, "
        f"{args.threads} thread(s) each, {args.steps} timed steps, a log window every "
        f"{args.window} steps, {args.rounds} rounds:"
    )
    off = statistics.median(r.mean for r in runs[False])
    on = statistics.median(r.mean for r in runs[True])
    ratio = statistics.median(ratios)
    print(f"  {'without reports:':<40} {off:8.1f} images/s (median)")
    second = (
        "again without reports (--control)"
        if args.control
        else f"with reports, at most every {args.interval:g} s"
    )
    print(f"  {second + ':':<40} {on:8.1f} images/s (median)")
    spread = f"{min(ratios):.4f}..{max(ratios):.4f}"
    cost = 100 * (1 - ratio)
    print(f"  ratio (median of rounds): {ratio:.4f}: cost {cost:+.2f}% (target <= 1%); {spread}")
    fastest = statistics.median(r.best for r in runs[False])
    step_s = args.batch_size / fastest  # the shortest steps: the largest share
    window_s = step_s * args.window
    report_share = costs.report_cpu_s / max(args.interval, window_s)
    share = (costs.update_s / window_s + report_share) * 100
    print(
        f"  direct: {costs.update_s * 1e6:.1f} us per update() (one per log window, on the "
        f"training thread); a report {costs.report_s * 1e3:.2f} ms of wall time, "
        f"{costs.report_cpu_s * 1e3:.2f} ms of CPU (TLS, JSON; on its own thread); against a "
        f"{step_s * 1e3:.1f} ms step, even if each report's CPU came off the training thread: "
        f"{share:.3f}%"
    )


@dataclass(frozen=True)
class DirectCosts:
    update_s: float
    """Seconds of one ``update()`` and ``offer()`` (the training thread's part)."""
    report_s: float
    """Wall seconds of one report (the reporter's thread; the stand-in server's work included)."""
    report_cpu_s: float
    """CPU seconds of one report on the reporter's thread (TLS handshake, JSON)."""


def direct_costs(endpoint: Endpoint, folder: Path) -> DirectCosts:
    """What one ``update()`` and one report cost, timed in this process."""
    from trainer.run_log import RunLog

    target = StatusEndpoint(
        url=endpoint.server.url("bench", "direct"),
        token_file=endpoint.token_file,
        ca_file=endpoint.ca_file,
    )
    reporter = StatusReporter(
        target, interval_s=3600.0, timeout_s=5.0, log=RunLog(folder, is_main=False)
    )
    figures = ProgressTracker()
    updates = 20_000
    started = time.perf_counter()
    for step in range(1, updates + 1):
        progress = figures.update(
            step=step,
            total_steps=updates,
            eta_s=float(updates - step),
            epoch=0,
            loss=1.0,
            learning_rate=0.1,
            images_per_second=150.0,
        )
        reporter.offer(progress)
    per_update = (time.perf_counter() - started) / updates
    reporter.close()
    status = reporter_status(updates)
    reports = 50
    started, cpu = time.perf_counter(), time.thread_time()
    for _ in range(reports):
        post_status(target, status, timeout_s=5.0)
    return DirectCosts(
        update_s=per_update,
        report_s=(time.perf_counter() - started) / reports,
        report_cpu_s=(time.thread_time() - cpu) / reports,
    )


def reporter_status(step: int) -> dict:
    from trainer.progress import Progress

    metrics = {"loss": 1.0, "val_loss": 1.1, "val_accuracy": 0.5, "images_per_second": 150.0}
    metrics |= {"learning_rate": 0.1, "epoch": 0, "step": step, "total_steps": step}
    return Progress(step=step, total_steps=step, eta_s=0.0, metrics=metrics).trainer_status()


if __name__ == "__main__":
    main()
