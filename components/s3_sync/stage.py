"""``python -m components.s3_sync.stage``: stage a data set on this node, then (optionally) run.

    python -m components.s3_sync.stage --source s3://bucket/data --root /stage \\
        --link /stage/current [-- COMMAND ARGS...]

Syncs ``--source`` into ``--root`` (a mirror of that source, frozen by digest: see
``components.s3_sync.staging``), points ``--link`` at the frozen folder, and then replaces itself
with ``COMMAND`` (``os.execvp``: the command keeps this process, its signals and its exit code).
The launcher runs it as a PyTorchJob's init container, and as the command prefix of a TrainJob's
node (whose runtime patches cannot add an init container). Credentials and the endpoint come from
the environment (the Kubernetes Secret's ``AWS_*`` variables, ``AWS_ENDPOINT_URL_S3``).

A cache kept between pods (``--root`` on an admin's hostPath) stays bounded with
``--keep-snapshots N``: after staging, each source keeps its N most recently used frozen folders
and a source unused for ``--max-idle-days`` goes (``staging.evict``); the folder this run staged
stays marked in use for as long as ``COMMAND`` runs, so no other node's stager evicts it.

Exit codes: 0 staged (or the command's own), 2 bad arguments or not the expected data
(``--expect-digest``: it changed in S3 since the pipeline listed it), 1 the sync failed (retryable
by the job's restart policy: a network error is worth a retry).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from components.s3_sync import S3SyncError
from components.s3_sync.staging import evict, hold, point, stage
from kfp_ddp.s3_uri import s3_uri_problem

EXIT_USAGE = 2
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.s3_sync.stage",
        description="Stage a data set from S3 on this node (then run a command).",
    )
    parser.add_argument("--source", required=True, help="s3://bucket/prefix of the data set")
    parser.add_argument("--root", required=True, type=Path, help="local folder of the staging")
    parser.add_argument("--link", type=Path, help="symlink to the staged (frozen) data set")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: the env)")
    parser.add_argument(
        "--expect-digest",
        default=None,
        help="the listing digest the pipeline checked: another one fails (exit 2), nothing runs",
    )
    parser.add_argument(
        "--keep-snapshots",
        type=int,
        default=None,
        metavar="N",
        help="a cache: keep each source's N most recently used data sets (default: evict nothing)",
    )
    parser.add_argument(
        "--max-idle-days",
        type=float,
        default=7.0,
        help="with --keep-snapshots: remove a source unused this long entirely (default 7)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... to run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    problem = s3_uri_problem(args.source)
    if problem:
        print(
            f"stage: --source {args.source!r} is not an s3://bucket/prefix URI: {problem}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.keep_snapshots is not None and args.keep_snapshots < 1:
        print(f"stage: --keep-snapshots {args.keep_snapshots} must be 1 or more", file=sys.stderr)
        return EXIT_USAGE

    try:
        staged = stage(
            args.source,
            args.root,
            endpoint_url=args.endpoint_url,
            expect_digest=args.expect_digest,
        )
    except S3SyncError as exc:
        print(f"stage: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED
    except PermissionError as exc:
        print(
            f"stage: cannot write {exc.filename or args.root}: the staging folder must be "
            f"writable by UID {os.getuid()} / GID {os.getgid()} (a hostPath cache: create it on "
            "the nodes owned by that user, or set run_as_user to its owner)",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_USAGE
    hold(staged.snapshot)  # kept across exec: in use while COMMAND runs
    if args.link:
        point(args.link, staged.snapshot)
    print(f"stage: {staged.report.summary()}; data at {args.link or staged.snapshot}", flush=True)
    if args.keep_snapshots is not None:
        evicted = evict(args.root, keep=args.keep_snapshots, max_idle_days=args.max_idle_days)
        print(f"stage: {evicted.summary()}", flush=True)
    if command:
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
