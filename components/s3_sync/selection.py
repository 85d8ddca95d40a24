"""Which keys take part in a sync (the include/exclude globs), where a key may land on disk (never
outside the destination), and the digest of a selection."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def selected(rel: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """A key syncs if it matches an include glob (or there are none) and no exclude glob."""
    if include and not any(fnmatch.fnmatchcase(rel, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(rel, p) for p in exclude)


def selected_by_filters(rel: str, filters: Sequence[tuple[str, str]]) -> bool:
    """``aws s3 sync`` semantics: selected to begin with, the last matching filter decides."""
    chosen = True
    for kind, pattern in filters:
        if fnmatch.fnmatchcase(rel, pattern):
            chosen = kind == "include"
    return chosen


NAME_MAX_BYTES = 255
"""The longest file or folder name, in bytes, that Linux file systems take (ext4, XFS, overlayfs:
NAME_MAX); S3 allows a key of 1024 bytes in one segment."""


def path_problem(rel: str) -> str | None:
    """Why key suffix ``rel`` cannot be a path under the destination, None if it can.

    Refused: empty, absolute, containing a backslash or NUL, with an empty, ``.`` or ``..``
    segment (a trailing ``/`` is a folder marker and allowed), or with a segment longer than a
    file name can be (the write would fail mid-transfer).
    """
    if not rel:
        return "an empty path"
    if rel.startswith("/"):
        return "an absolute path"
    if "\\" in rel or "\x00" in rel:
        return "a backslash or NUL in it"
    parts = rel[:-1].split("/") if rel.endswith("/") else rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "an empty, '.' or '..' path segment"
    if _DRIVE_RE.match(parts[0]):  # a Windows drive ("C:") is absolute there
        return "a Windows drive"
    if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES for part in parts):
        return f"a name longer than {NAME_MAX_BYTES} bytes, the most a file system takes"
    return None


def safe_relative_path(rel: str) -> str | None:
    """The local relative path for key suffix ``rel``, or None if it must be refused
    (:func:`path_problem` says why)."""
    if path_problem(rel) is not None:
        return None
    return rel[:-1] if rel.endswith("/") else rel


def parents(rel: str) -> Iterator[str]:
    """The folders on the way to ``rel``: "a/b/c" → "a", "a/b"."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def stays_inside(dest_real: str, dest: Path, rel: str) -> bool:
    """True if dest/rel (after resolving any symlinks on the way) stays inside dest."""
    parent = os.path.dirname(rel)
    if not parent:
        return True
    resolved = os.path.realpath(os.path.join(dest, parent))
    return resolved == dest_real or resolved.startswith(dest_real + os.sep)


def listing_digest(entries: Iterable[tuple[str, int, str]]) -> str:
    """sha256 over sorted (relative key, size, ETag) lines."""
    h = hashlib.sha256()
    for rel, size, etag in sorted(entries):
        h.update(f"{rel}\t{size}\t{etag}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()
