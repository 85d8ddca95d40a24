"""``make demo``: the whole pipeline on this machine, on real data, in a few minutes.

1. Writes scikit-learn's bundled handwritten digits (1,797 real scans, 10 classes) as an
   ImageFolder of PNGs with a fixed train/val split.
2. Starts a local S3 server (SeaweedFS on loopback, free ports, its own key pair) and uploads the
   data set with our S3 sync. The server is stopped on success, failure and Ctrl-C.
3. Runs the training pipeline through ``kfp.local`` with the local launcher backend: check the
   arguments, look at the data in S3, train with DDP (2 nodes under Kubeflow Trainer v2's env
   contract, gloo, each staging the data onto its own folder and mirroring checkpoints and the
   model to S3), evaluate, and publish the model back to S3 if it passes the gate. That is the
   object-store storage mode, what most clusters need (no ReadWriteMany volume); ``--storage
   shared-volume`` runs the other one (a workspace folder stands in for the shared claim). The
   console shows one line per step and the trainer's progress; everything else goes to a log
   file whose path is printed (``--verbose`` shows it live).
4. Prints a short summary and writes it to ``<output>/summary.json``.

A second run is incremental: the data set, the S3 server's storage and the workspace stay under
``<output>``, so nothing is transferred again, and training resumes its finished checkpoint (same
data, same settings) instead of starting again. ``--fresh`` starts from scratch: it removes what
the demo made, and only from a folder the demo made (its marker file is there); a non-empty
folder without the marker is refused and left as it is (exit 2). The pipeline's arguments are
checked before anything is written or started: a bad one (``--model no_such_model``) is refused
in a second, naming it and the fix (exit 2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_ddp.atomic_files import write_json_atomic
from kfp_ddp.local_s3 import data_dir_holder
from pipelines.digits import write_digits_image_folder
from pipelines.local_data import served_folder
from pipelines.local_run import LocalRunError, check_run_arguments, run_local

DEMO_BUCKET = "kfp-ddp-demo"
DATA_PREFIX = "datasets/digits"
MODELS_PREFIX = "models"
DEMO_CHECKPOINT_EVERY_STEPS = 20
"""The demo's checkpoint interval: a killed demo resumes from at most 20 steps back."""
DEMO_IMAGE_SIZE = 32
"""The side of the demo's PNGs (the 8 px digits scaled up): what it trains on unless
``--image-size`` says otherwise."""
STORAGE_NOTES = {
    "object-store": (
        " (no shared volume, as on any cluster: each node stages the data onto its own disk, "
        "checkpoints and the model go through S3; --storage shared-volume for the other mode)"
    ),
    "shared-volume": " (the steps and the nodes share a workspace folder, like a RWX claim)",
}
EXIT_REFUSED = 2
"""Refused before anything ran: a bad argument, or an output folder that is not the demo's to
clear (``--fresh``); nothing was written, started or deleted."""
CHECK_ENDPOINT = "http://127.0.0.1:9000"
"""Stands in for the S3 server's address (known once it runs) when the arguments are checked
before it starts: the check contacts nothing."""


class OutputRefused(Exception):
    """``--output`` cannot be used as asked; the message names the folder, why, and the fix."""


class ArgumentsRefused(Exception):
    """The pipeline would refuse an argument; the message names each one and the fix."""


@dataclass(frozen=True)
class DemoOutput:
    """The demo's output folder and everything it makes there (``--fresh`` removes these only)."""

    root: Path

    MARKER = ".kfp-ddp-demo"
    """Written when the demo creates the folder (or finds it empty): the folder is the demo's."""
    ENTRIES = ("dataset", "s3-data", "workspace", "kfp-runs", "logs", "summary.json", "report.html")
    """What the demo writes under ``root``, by name."""

    @property
    def marker(self) -> Path:
        return self.root / self.MARKER

    def __truediv__(self, entry: str) -> Path:
        if entry not in self.ENTRIES:
            raise KeyError(f"{entry!r} is not one of the demo's entries {self.ENTRIES}")
        return self.root / entry

    def is_marked(self) -> bool:
        return self.marker.is_file() and not self.marker.is_symlink()

    def prepare(self, *, fresh: bool) -> None:
        """Create the folder (marked), or reuse it; with ``fresh``, clear what the demo made.

        Raises OutputRefused (nothing deleted) when ``fresh`` meets a folder the demo did not
        make: it exists, is not empty and has no marker — or is not a folder at all.
        """
        root = self.root
        if root.exists() and not root.is_dir():
            raise OutputRefused(f"--output {root}: it exists and is not a folder; pick a folder")
        running = data_dir_holder(self / "s3-data")
        if running is not None:
            raise OutputRefused(
                f"--output {root}: another demo is running there (its S3 server, pid {running}); "
                "nothing was touched. Wait for it to end, or pick another --output"
            )
        empty = not root.exists() or not any(root.iterdir())
        if fresh and not empty:
            if not self.is_marked():
                raise OutputRefused(
                    f"--fresh refuses to clear {root}: it is not empty and has no {self.MARKER} "
                    "file, so the demo did not make it (or made it before the marker existed); "
                    "nothing was deleted. Pick another --output, or delete the folder yourself "
                    "if nothing in it is needed."
                )
            self.clear()
        root.mkdir(parents=True, exist_ok=True)
        if empty or fresh:
            self.marker.write_text(
                "Made by `python -m pipelines.demo`; `--fresh` removes only: "
                f"{', '.join(self.ENTRIES)}.\n"
            )

    def clear(self) -> None:
        """Remove the demo's entries (a link is removed, never followed); leave anything else."""
        for entry in self.ENTRIES:
            path = self.root / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", type=Path, default=Path("demo-output"), help="output folder")
    parser.add_argument("--epochs", type=int, default=8, help="training epochs (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="DDP worker processes (default 2)")
    parser.add_argument("--model", default="resnet18", help="torchvision model (resnet18)")
    parser.add_argument("--batch-size", type=int, default=64, help="per process (default 64)")
    parser.add_argument("--lr", type=float, default=0.1, help="base LR per 256 images (0.1)")
    parser.add_argument(
        "--image-size",
        type=int,
        default=DEMO_IMAGE_SIZE,
        help=f"training images' side in px (default {DEMO_IMAGE_SIZE}, the PNGs' own; some "
        "models need more: the ViTs take 224 only)",
    )
    parser.add_argument("--threshold", type=float, default=0.95, help="publish gate (0.95)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="remove what an earlier demo run left in --output first (only in a folder the "
        f"demo made: it holds {DemoOutput.MARKER})",
    )
    parser.add_argument(
        "--storage",
        choices=("object-store", "shared-volume"),
        default="object-store",
        help="object-store (default: no shared volume, each node stages the data and "
        "checkpoints go through S3) or shared-volume (a folder stands in for the shared claim)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show every line of the pipeline's log live"
    )
    args = parser.parse_args(argv)
    for flag, value, low in (("--epochs", args.epochs, 1), ("--workers", args.workers, 1)):
        if value < low:
            parser.error(f"{flag}={value}: must be at least {low}")
    if not 0.0 <= args.threshold <= 1.0:
        parser.error(f"--threshold={args.threshold}: must be between 0 and 1")
    return args


def run_demo(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo and return its summary (also written to ``<output>/summary.json``)."""

    started = time.monotonic()
    output = DemoOutput(args.output.resolve())
    _check_arguments(args, output)
    output.prepare(fresh=args.fresh)
    dataset = output / "dataset"
    counts = write_digits_image_folder(dataset, image_size=DEMO_IMAGE_SIZE)
    print(f"data set: {counts['train']} train / {counts['val']} val digits under {dataset}")
    print(f"storage: {args.storage}" + STORAGE_NOTES[args.storage])

    with served_folder(
        dataset,
        output / "s3-data",
        bucket=DEMO_BUCKET,
        data_prefix=DATA_PREFIX,
        models_prefix=MODELS_PREFIX,
    ) as served:
        print(f"local S3 server (SeaweedFS, pid {served.server.pid}) at {served.endpoint_url}")
        print(
            f"uploaded the data set to {served.data_uri}: {served.upload.transferred} "
            f"transferred, {served.upload.skipped} unchanged"
        )
        run = run_local(
            _pipeline_arguments(
                args,
                data_uri=served.data_uri,
                endpoint_url=served.endpoint_url,
                models_uri=served.models_uri,
            ),
            workspace=output / "workspace",
            storage=args.storage,
            pipeline_root=output / "kfp-runs",
            verbose=args.verbose,
            log_dir=output / "logs",
        )
        published_files = _published_files(served.server, run.published_uri)

    report = None
    if run.report:  # KFP names the HTML artifact "report"; a copy a browser opens by its name
        report = output / "report.html"
        shutil.copyfile(run.report, report)
    summary = {
        "accuracy": run.metrics.get("accuracy"),
        "top_k_accuracy": run.metrics.get("top_k_accuracy"),
        "top_k": run.metrics.get("top_k"),
        "passed": run.passed,
        "published_uri": run.published_uri,
        "published_files": published_files,
        "images_per_sec": run.training.get("images_per_sec"),
        "train_wall_time_s": run.training.get("wall_time_s"),
        "world_size": int(run.training.get("world_size") or 0) or None,
        "data_sync": run.data_sync,
        "demo_wall_time_s": round(time.monotonic() - started, 1),
        "report_html": str(report) if report else None,
        "model_dir": str(run.model_dir) if run.model_dir else None,
        "run_dir": str(run.run_dir),
    }
    write_json_atomic(output / "summary.json", summary)
    return summary


def _check_arguments(args: argparse.Namespace, output: DemoOutput) -> None:
    """The pipeline's check of the demo's arguments, before anything is written or started: a
    bad ``--model`` costs a second, not an S3 server and an upload. Raises ArgumentsRefused."""
    arguments = _pipeline_arguments(
        args,
        data_uri=f"s3://{DEMO_BUCKET}/{DATA_PREFIX}",
        endpoint_url=CHECK_ENDPOINT,
        models_uri=f"s3://{DEMO_BUCKET}/{MODELS_PREFIX}",
    )
    try:
        check_run_arguments(arguments, output / "workspace", args.storage)
    except LocalRunError as exc:
        raise ArgumentsRefused(str(exc)) from None


def _pipeline_arguments(
    args: argparse.Namespace, *, data_uri: str, endpoint_url: str, models_uri: str
) -> dict[str, Any]:
    """The training pipeline's arguments for the demo's flags and its S3 places."""
    return {
        "data_uri": data_uri,
        "s3_endpoint": endpoint_url,
        "workers": args.workers,
        "gpus_per_worker": 0,
        "model": args.model,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "image_size": args.image_size,
        # a killed demo resumes: its ~90 steps would never reach the default 200
        "checkpoint_every_steps": DEMO_CHECKPOINT_EVERY_STEPS,
        # Digits must not be mirrored (the default, auto, finds so too), nor shifted at 32 px,
        # and a short warmup keeps a from-scratch ResNet's first steps stable.
        "trainer_args": [
            *("--augment", "none", "--warmup-steps", "10"),
            *("--log-interval", "5"),  # enough points for the report's curves
        ],
        "accuracy_threshold": args.threshold,
        "publish_uri": models_uri,
    }


def _published_files(s3: Any, published_uri: str | None) -> list[str]:
    """The keys under the published prefix, read back from the server (proof, not a promise)."""
    if not published_uri:
        return []
    bucket, _, prefix = published_uri.removeprefix("s3://").partition("/")
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", []))


def _print_summary(summary: dict[str, Any], output: Path) -> None:
    def num(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, int | float) else "n/a"

    sync_info = summary.get("data_sync") or {}
    print()
    print("=== kfp-ddp demo ===")
    accuracy, top_k = num(summary["accuracy"], ".4f"), num(summary["top_k_accuracy"], ".4f")
    print(f"accuracy (held-out): {accuracy}   top-{summary['top_k'] or 5}: {top_k}")
    workers = int(summary["world_size"] or 0)
    if summary["images_per_sec"] is None:
        print(
            f"training: reused the finished checkpoint (same data and settings), {workers} workers"
        )
    else:
        print(
            f"training: {num(summary['images_per_sec'], ',.0f')} images/s on {workers} workers, "
            f"{num(summary['train_wall_time_s'], '.1f')} s"
        )
    if "transferred" in sync_info:
        print(
            f"data sync: {sync_info.get('transferred', 0):.0f} transferred, "
            f"{sync_info.get('files', 0):.0f} files in the source"
        )
    elif sync_info:
        print(f"data: {sync_info.get('files', 0):.0f} files listed; each node staged its own copy")
    print(f"gate: {'passed' if summary['passed'] else 'FAILED'}")
    print(f"published: {summary['published_uri'] or 'nothing (the gate failed)'}")
    print(f"curves + confusion matrix: {summary['report_html']}")
    print(f"model: {summary['model_dir']}")
    print(f"total: {summary['demo_wall_time_s']:.1f} s   summary: {output / 'summary.json'}")


def _wait_for_children(limit_s: float = 60.0) -> None:
    """Let the interrupted pipeline step stop its training nodes before the demo exits.

    Ctrl-C reaches the step's process too; it stops its nodes (SIGTERM: a last checkpoint, then
    SIGKILL after a grace period). Returning earlier would leave them running for a moment.
    """
    import time

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children left
        except KeyboardInterrupt:
            continue  # a second Ctrl-C: keep waiting, the nodes are being stopped
        if pid == 0:
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        summary = run_demo(args)
    except (OutputRefused, ArgumentsRefused) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        _wait_for_children()
        print("demo interrupted; the local S3 server was stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line; the pipeline error names the task and its logs
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    _print_summary(summary, args.output.resolve())
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
