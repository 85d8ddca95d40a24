"""A source URI that names one object, not a prefix: said, not synced as an empty folder.

A sync copies the objects under a prefix, so ``s3://bucket/datasets/flowers.zip`` is read as the
folder ``flowers.zip/``, which holds nothing: the download found 0 files, and the pipeline's
data step said the data set "has no train/ folder (it has nothing)". When a listing is empty, a
download asks (HEAD) whether the URI without its slash is an object, and refuses it by name;
an archive (``.zip``, ``.tar.gz``...) is named as one, with how to unpack it into a prefix.
"""

from __future__ import annotations

from components.s3_sync.connection import S3Connection
from components.s3_sync.errors import S3SyncUsageError
from components.s3_sync.s3_uri import S3Location

ARCHIVE_SUFFIXES = (
    ".zip",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz2",
    ".tar.xz",
    ".txz",
    ".tar.zst",
    ".7z",
    ".rar",
)
"""Lower-case endings of archive files, which a sync copies as they are, never unpacked."""


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def check_not_one_object(conn: S3Connection, src: S3Location) -> None:
    """Raise S3SyncUsageError when ``src``, whose listing is empty, names an object itself
    (another error of the HEAD, e.g. no permission to read it, leaves the empty listing as it
    is)."""
    key = src.prefix.rstrip("/")
    if not key:
        return
    try:
        head = conn.client.head_object(Bucket=src.bucket, Key=key)
    except Exception:  # noqa: BLE001 - a 404 (no such object) or anything else: nothing to add
        return
    uri = f"s3://{src.bucket}/{key}"
    size = int(head.get("ContentLength") or 0)
    what = "an archive" if is_archive(key) else "a file"
    fix = (
        "unpack it and upload its folders under a prefix (e.g. unzip it, then `aws s3 sync "
        f"./folder s3://{src.bucket}/{_stem(key)}/`) and name that prefix"
        if is_archive(key)
        else f"name the prefix that holds it (s3://{src.bucket}/{key.rpartition('/')[0]})"
    )
    raise S3SyncUsageError(
        f"{uri} is one object ({what}, {size:,} bytes), not a prefix of objects: a sync copies "
        f"the objects under a prefix, and nothing is under {uri}/; {fix}"
    )


def _stem(key: str) -> str:
    """``datasets/flowers`` of ``datasets/flowers.tar.gz``."""
    lowered = key.lower()
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if lowered.endswith(suffix):
            return key[: -len(suffix)]
    return key
