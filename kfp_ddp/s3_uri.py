"""The one parser of ``s3://bucket/prefix`` URIs, with S3's bucket naming rules.

Every part that takes an S3 URI — the pipeline's parameters, the launcher's spec and step, the
trainer's ``--checkpoint-uri`` / ``--output-uri``, the S3 sync — parses it here, so a URI one
part accepts is accepted by all of them, and one they refuse is refused by the first.
Bucket names (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html):
3-63 characters of a-z 0-9 . -, starting and ending with a letter or digit, no two dots in a
row, not an IP address, none of S3's reserved prefixes and suffixes. The prefix is plain
segments: no empty, ``.`` or ``..`` segment, no backslash or NUL, and no space at either end of
the URI (a pasted value's stray blank).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


class S3UriError(ValueError):
    """``uri`` is not a usable S3 URI; ``problem`` says why (without naming a setting: the caller
    names the one it came from)."""

    def __init__(self, uri: str, problem: str):
        super().__init__(uri, problem)
        self.uri = uri
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.uri!r} is not an s3://bucket/prefix URI: {self.problem}"


@dataclass(frozen=True)
class S3Uri:
    """A bucket and a key prefix (``""`` for the whole bucket; never a leading or trailing
    slash)."""

    bucket: str
    prefix: str

    @property
    def uri(self) -> str:
        """``s3://bucket/prefix`` (``s3://bucket`` without a prefix), no trailing slash."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def holds(self, other: S3Uri) -> bool:
        """Whether ``other`` is this place or lies inside it (whole segments: ``s3://b/data``
        holds ``s3://b/data/x``, not ``s3://b/data2``)."""
        if other.bucket != self.bucket:
            return False
        return (
            not self.prefix
            or other.prefix == self.prefix
            or other.prefix.startswith(f"{self.prefix}/")
        )


def bucket_problem(bucket: str) -> str | None:
    """What S3's naming rules say against ``bucket``, or None."""
    if not _BUCKET.fullmatch(bucket):
        return (
            f"{bucket!r} is not a bucket name (3-63 characters of a-z 0-9 . -, starting and "
            "ending with a letter or digit)"
        )
    if ".." in bucket:
        return f"{bucket!r} is not a bucket name (two dots in a row)"
    if _IP_ADDRESS.fullmatch(bucket):
        return f"{bucket!r} is not a bucket name (an IP address)"
    reserved = [p for p in RESERVED_PREFIXES if bucket.startswith(p)]
    reserved += [s for s in RESERVED_SUFFIXES if bucket.endswith(s)]
    if reserved:
        return f"{bucket!r} is not a bucket name ({reserved[0]!r} is reserved by S3)"
    return None


def parse_s3_uri(uri: str, *, prefix_required: bool = False) -> S3Uri:
    """``s3://bucket[/prefix][/]`` → ``S3Uri``; raises ``S3UriError`` saying what is wrong.

    ``prefix_required``: refuse the bucket's root (a place of its own is wanted, e.g. for a
    model or checkpoints).
    """
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise S3UriError(uri, "write s3:// (lower case, two slashes), a bucket and a prefix")
    if uri != uri.strip():
        raise S3UriError(uri, "it starts or ends with a space")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    problem = bucket_problem(bucket)
    if problem:
        raise S3UriError(uri, problem)
    prefix = prefix.removesuffix("/")
    if prefix and (
        any(part in ("", ".", "..") for part in prefix.split("/"))
        or any(char in prefix for char in "\\\x00")
    ):
        raise S3UriError(uri, "its prefix has an empty, '.' or '..' segment, a backslash or a NUL")
    if prefix_required and not prefix:
        raise S3UriError(uri, "it names no prefix inside the bucket")
    return S3Uri(bucket=bucket, prefix=prefix)


def s3_uri_problem(uri: str, *, prefix_required: bool = False) -> str | None:
    """``parse_s3_uri``'s complaint about ``uri`` (its ``problem``), or None if it is usable."""
    try:
        parse_s3_uri(uri, prefix_required=prefix_required)
    except S3UriError as exc:
        return exc.problem
    return None
