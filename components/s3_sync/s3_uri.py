"""``s3://bucket/prefix`` URIs: which side of a sync is S3, and where in S3 it is."""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.s3_sync.errors import S3SyncUsageError

_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
"""The characters of S3's bucket names (a-z 0-9 . -), plus the upper case and underscores of
legacy buckets and some self-hosted servers; the server checks the rest (e.g. the length)."""
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
"""Something that reads as a URI (``s3:/x``, ``S3://x``, ``gs://x``), not a local path
(a Windows drive ``C:/`` has a one-letter scheme)."""


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix ("" or ending in "/")."""

    bucket: str
    prefix: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def is_s3_uri(value: str) -> bool:
    return str(value).startswith("s3://")


def check_local_or_s3(name: str, value: str) -> None:
    """Refuse a value that looks like a URI but is not a well-formed ``s3://`` one."""
    if is_s3_uri(value):
        parse_s3_uri(value, name=name)
    elif _SCHEME_RE.match(str(value)):
        raise S3SyncUsageError(
            f"{name}={value!r} is neither an s3://bucket/prefix URI nor a local folder; write "
            "s3://bucket/prefix (lower-case s3, two slashes), or ./PATH for a local folder"
        )


def parse_s3_uri(uri: str, *, name: str = "uri") -> S3Location:
    """``s3://bucket[/prefix]`` → location whose prefix is "" or ends with "/"."""
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise S3SyncUsageError(
            f"{name}={uri!r}: {bucket!r} is not a bucket name; expected s3://bucket/prefix "
            "with a bucket name of letters, digits, dots and hyphens"
        )
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return S3Location(bucket=bucket, prefix=prefix)
