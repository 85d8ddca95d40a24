"""``sync(source, destination)``: one entry point for both directions.

How it decides, in one listing pass of each side: *unchanged* means same size and same ETag
(local ETags from the hash cache or hashed, no request); every download is verified before it
gets its final name and made durable before the rename (download.py, fetch.py, verify.py); keys
that would escape the destination are refused (selection.py); ``delete`` is guarded
(delete_guard.py); settings are botocore's (connection.py); the bytes move through the AWS CRT
or botocore (engine.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from components.s3_sync.connection import S3Connection
from components.s3_sync.download import DownloadJob
from components.s3_sync.engines import resolve_engine
from components.s3_sync.errors import S3SyncError
from components.s3_sync.options import SyncOptions, SyncReport
from components.s3_sync.s3_uri import parse_s3_uri
from components.s3_sync.upload import UploadJob

if TYPE_CHECKING:
    from components.s3_sync.download import DownloadJob
    from components.s3_sync.upload import UploadJob

log = logging.getLogger("components.s3_sync")


def sync(source: str | os.PathLike, destination: str | os.PathLike, **options) -> SyncReport:
    """Sync ``source`` to ``destination`` (one is ``s3://bucket/prefix``, the other a folder).

    ``options``: any other field of ``SyncOptions`` (``endpoint_url``, ``include``, ``exclude``,
    ``filters``, ``delete``, ``max_delete``, ``dry_run``, ``region``, ``addressing_style``,
    ``max_concurrency``, ``progress``, ``engine``).

    Raises:
        S3SyncUsageError: bad options, or deletions that need ``max_delete`` (nothing changed).
        S3SyncError: with one message naming the bucket/endpoint/path and what to check.
    """
    return run_sync(SyncOptions(source=str(source), destination=str(destination), **options))


def run_sync(options: SyncOptions) -> SyncReport:
    """Run the sync described by ``options``."""
    started = time.monotonic()
    engine = resolve_engine(options.engine)
    conn = S3Connection(
        endpoint_url=options.endpoint_url,
        region=options.region,
        addressing_style=options.addressing_style,
        max_concurrency=options.max_concurrency,
    )
    # each direction imports only its own modules (a CLI run does one of them)
    job: DownloadJob | UploadJob
    if options.download:
        src = parse_s3_uri(options.source)
        job = DownloadJob(options, conn, engine, src, Path(options.destination))
    else:
        dst = parse_s3_uri(options.destination)
        job = UploadJob(options, conn, engine, Path(options.source), dst)
    try:
        report = job.run()
    except OSError as exc:
        local = options.destination if options.download else options.source
        raise S3SyncError(
            f"local I/O error in {local!r}: {exc}; check that the folder is writable, has free "
            "space and that no file stands where a folder is needed (or vice versa)"
        ) from exc
    finally:
        conn.close()  # no CRT thread outlives a sync: the caller may fork afterwards
    report.seconds = time.monotonic() - started
    log.debug("s3-sync: %s", report.summary())
    return report
