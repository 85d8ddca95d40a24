"""``s3://bucket/prefix`` URIs: which side of a sync is S3, and where in S3 it is."""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.s3_sync.errors import S3SyncUsageError
from kfp_ddp.s3_uri import S3UriError
from kfp_ddp.s3_uri import parse_s3_uri as parse_uri

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
    """``s3://bucket[/prefix]`` → location whose prefix is "" or ends with "/" (the one parser,
    ``kfp_ddp.s3_uri``: S3's bucket naming rules)."""
    try:
        parsed = parse_uri(uri)
    except S3UriError as exc:
        raise S3SyncUsageError(
            f"{name}={uri!r}: {exc.problem}; expected s3://bucket/prefix"
        ) from None
    return S3Location(bucket=parsed.bucket, prefix=f"{parsed.prefix}/" if parsed.prefix else "")
