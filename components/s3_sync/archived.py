"""Objects in an archive storage class: found before a download starts, not by its GETs.

S3 lists an object of S3 Glacier Flexible Retrieval (``GLACIER``) or Deep Archive
(``DEEP_ARCHIVE``) like any other, but a GET of it fails (``InvalidObjectState``, a 403) until a
restore has made a copy readable, which takes minutes to hours. A lifecycle rule that archives
old images makes a data set half unreadable without a word; found by the GETs, that is one failed
download among many on every training node, after each node has started. So a download first
asks (HEAD) whether each archived object it would fetch has been restored, and refuses before
transferring anything — a dry run too, which is how the pipeline's data step lists the data.

An Intelligent-Tiering object in an archive tier is listed as ``INTELLIGENT_TIERING``: only its
GET finds it (``errors.translate`` then says what it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from components.s3_sync.connection import S3Connection
from components.s3_sync.errors import RESTORE_HOW, S3SyncError
from components.s3_sync.listing import RemoteObject

ARCHIVED_CLASSES = ("GLACIER", "DEEP_ARCHIVE")
"""Storage classes whose objects a GET reads only once restored (Glacier Instant Retrieval is
read like STANDARD)."""
CHECKED_MAX = 200
"""Archived objects asked about (HEAD) before a download; past these, a GET finds the rest."""
SHOWN = 10
"""Unrestored objects named in the error (all of them are counted)."""
_THREADS = 16


def unrestored(conn: S3Connection, bucket: str, objects: Sequence[RemoteObject]) -> list:
    """The archived objects among ``objects`` (the first ``CHECKED_MAX`` of them) that a GET
    cannot read yet: never restored, or a restore still running."""
    archived = [ob for ob in objects if ob.storage_class in ARCHIVED_CLASSES][:CHECKED_MAX]
    if not archived:
        return []
    with ThreadPoolExecutor(min(_THREADS, len(archived)), thread_name_prefix="s3sync-head") as pool:
        readable = list(pool.map(lambda ob: _restored(conn, bucket, ob.key), archived))
    return [ob for ob, ok in zip(archived, readable, strict=True) if not ok]


def _restored(conn: S3Connection, bucket: str, key: str) -> bool:
    """Whether a restored copy of ``key`` is there to read (its ``x-amz-restore`` header)."""
    try:
        head = conn.client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        raise conn.translate(exc, bucket=bucket, key=key) from exc
    return 'ongoing-request="false"' in str(head.get("Restore") or "")


def check_archived(
    conn: S3Connection, bucket: str, source: str, objects: Sequence[RemoteObject]
) -> None:
    """Raise S3SyncError naming the archived objects of ``objects`` that are not restored."""
    missing = unrestored(conn, bucket, objects)
    if not missing:
        return
    named = ", ".join(f"{ob.rel!r} ({ob.storage_class})" for ob in missing[:SHOWN])
    more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    raise S3SyncError(
        f"{len(missing)} object(s) under {source} are archived and not restored: {named}{more}; "
        f"no one can read them until they are restored: {RESTORE_HOW}"
    )
