"""CLI: ``python -m components.s3_sync SOURCE DEST [--endpoint-url URL] [--include GLOB]...
[--exclude GLOB]... [--delete [--max-delete N|P%]] [--dry-run] [--json] [-q]``.

Prints one summary line on stdout and exits 0 (with ``--dry-run`` also one ``would transfer`` /
``would delete`` line per path on stderr). On failure it prints one ``error:`` line on stderr
and exits 2 for bad arguments (including a malformed s3:// URI, both sides local or both S3,
and deletions that need ``--max-delete``; a dry run lists those deletions first), 1 for a
failed sync, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys

from components.s3_sync.api import run_sync
from components.s3_sync.delete_guard import DeletionsRefused
from components.s3_sync.errors import S3SyncError, S3SyncUsageError
from components.s3_sync.options import SyncOptions
from kfp_ddp import __version__

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _OrderedFilter(argparse.Action):
    """Collect --include/--exclude into one list of (kind, glob) in command-line order."""

    def __call__(self, parser, namespace, values, option_string=None):
        filters = list(getattr(namespace, self.dest) or [])
        filters.append((option_string.lstrip("-"), values))
        setattr(namespace, self.dest, filters)


def build_parser() -> argparse.ArgumentParser:

    p = argparse.ArgumentParser(
        prog="python -m components.s3_sync",
        description="Sync s3://bucket/prefix <-> a local folder (incremental, verified, atomic).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("source", help="s3://bucket/prefix or a local folder")
    p.add_argument("destination", help="a local folder or s3://bucket/prefix")
    p.add_argument(
        "--endpoint-url",
        default=None,
        help="S3 endpoint (default: as botocore finds it: AWS_ENDPOINT_URL_S3, "
        "AWS_ENDPOINT_URL, the AWS config, else AWS)",
    )
    # Like `aws s3 sync`: everything is selected, then each --include/--exclude, in the order
    # given, re-selects or drops the keys it matches (the last match wins).
    p.add_argument(
        "--include",
        action=_OrderedFilter,
        dest="filters",
        default=[],
        metavar="GLOB",
        help="(re-)select keys matching GLOB; filters apply in order, the last match wins",
    )
    p.add_argument(
        "--exclude",
        action=_OrderedFilter,
        dest="filters",
        default=[],
        metavar="GLOB",
        help="drop keys matching GLOB (e.g. --exclude '*' --include '*.png' syncs only PNGs)",
    )
    p.add_argument("--delete", action="store_true", help="remove destination files not in source")
    p.add_argument(
        "--max-delete",
        default=None,
        metavar="N|P%",
        help="with --delete: allow at most N deletions, or P%% of the destination's files "
        "(default: at most half of them, however few, never all; --max-delete 100%% allows "
        "emptying it). Look first with --dry-run",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would change; change nothing")
    p.add_argument("--region", default=None, help="signing region (default: the AWS config's)")
    p.add_argument("--addressing-style", choices=("auto", "path", "virtual"), default=None)
    p.add_argument("--max-concurrency", type=int, default=32, help="transfers in flight")
    p.add_argument("--engine", choices=("auto", "crt", "classic"), default="auto")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    return p


def options_from_args(args: argparse.Namespace):
    """The ``SyncOptions`` that the parsed command line asks for."""
    return SyncOptions(
        source=args.source,
        destination=args.destination,
        endpoint_url=args.endpoint_url,
        filters=args.filters,
        delete=args.delete,
        max_delete=args.max_delete,
        dry_run=args.dry_run,
        region=args.region,
        addressing_style=args.addressing_style,
        max_concurrency=args.max_concurrency,
        progress=False if args.quiet else None,
        engine=args.engine,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on a usage error, 0 for -h/--version
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(message)s",
        stream=sys.stderr,
    )
    # botocore/urllib3 debug logs could carry request headers; keep them quiet.
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    try:
        report = run_sync(options_from_args(args))
    except DeletionsRefused as exc:
        if args.dry_run:  # what would go, then why the real run would not do it
            for rel in exc.would_delete:
                print(f"s3-sync: would delete {rel}", file=sys.stderr)
        print(f"s3-sync: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except S3SyncUsageError as exc:
        print(f"s3-sync: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except S3SyncError as exc:
        print(f"s3-sync: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("s3-sync: interrupted; re-run to complete the sync", file=sys.stderr)
        return EXIT_INTERRUPTED
    for rel in report.would_transfer:
        print(f"s3-sync: would transfer {rel}", file=sys.stderr)
    for rel in report.would_delete:
        print(f"s3-sync: would delete {rel}", file=sys.stderr)
    print(json.dumps(report.to_dict()) if args.json else f"s3-sync: {report.summary()}")
    return 0


def _tune_gc() -> None:
    """A sync allocates a few small objects per file and creates no garbage cycles to speak of:
    the cyclic GC's frequent passes over everything imported are pure overhead here."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 50)


def _exit_now(code: int) -> None:
    """End the process without tearing the interpreter down: everything the sync wrote is
    flushed, synced and closed (files, hash cache), and freeing botocore's models and the rest
    object by object took ~50 ms more than the sync itself needed. Only stdout and stderr are
    left to flush (a failed flush exits 120, as Python's own exit does)."""
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        code = 120
    os._exit(code)


if __name__ == "__main__":
    from components.s3_sync.connection import use_process_event_loops

    _tune_gc()
    use_process_event_loops()  # this process syncs once and exits (not so main() in a test)
    _exit_now(main())
