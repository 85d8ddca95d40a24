"""The hash cache: what a local folder's files hashed to, so that a re-run reads no data.

One small JSON per local folder in the user cache (``$S3SYNC_CACHE_DIR``, else
``~/.cache/kfp-ddp/s3-sync``), never inside the folder, keyed by (relative path, size,
mtime_ns). Best effort: an unreadable or unwritable cache only means files are hashed again.

The folder holds at most ``CACHE_LIMIT`` of them, the least recently used removed as a new one is
written: every run syncs temporary folders too (the evaluation's download, the model it
publishes, the trainer's uploads), whose caches no run reads again; without a bound they piled
up, ~8 a ``make demo``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import NamedTuple

from kfp_ddp.atomic_files import write_atomic

log = logging.getLogger("components.s3_sync")

CACHE_ENV = "S3SYNC_CACHE_DIR"
"""Env var naming the folder for the hash caches (default ``~/.cache/kfp-ddp/s3-sync``)."""
_FORMAT_VERSION = 1
CACHE_LIMIT = 256
"""How many folders' caches the cache folder keeps (the most recently used)."""
CACHE_NAME = re.compile(r"[0-9a-f]{32}\.json")
"""A cache file's name (``hash_cache_path``): nothing else in the folder is ever removed."""


class CacheEntry(NamedTuple):
    """What one file was, and what its bytes hash to (stored as a JSON list in this order)."""

    size: int
    mtime_ns: int
    md5: str | None
    """The file's content id: the MD5 of its bytes, or, for a file of PART_SIZE or more that an
    upload sent, the multipart ETag our upload gave it; None when unknown."""
    etag: str | None
    """ETag of the S3 object these bytes were last synced with."""


def hash_cache_path(root: str | os.PathLike) -> Path:
    """Where the hash cache of local folder ``root`` lives (outside the folder)."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "kfp-ddp", "s3-sync")
    real = os.path.realpath(root)
    name = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return Path(base) / f"{name}.json"


class HashCache:
    """``rel -> CacheEntry`` for the files of one local folder."""

    def __init__(self, root: Path, remote: str) -> None:
        self.path = hash_cache_path(root)
        self.root = os.path.realpath(root)
        self.remote = remote
        self.entries: dict[str, CacheEntry] = self._load()
        self.dirty = False

    def _load(self) -> dict[str, CacheEntry]:
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != _FORMAT_VERSION or data.get("root") != self.root:
                return {}
            _mark_used(self.path)
            return {
                rel: CacheEntry(*fields)
                for rel, fields in data.get("files", {}).items()
                if len(fields) == len(CacheEntry._fields)
            }
        except (OSError, ValueError, AttributeError, TypeError):
            return {}

    def get(self, rel: str, st: os.stat_result) -> CacheEntry | None:
        """The entry of ``rel`` if the file still has the size and mtime it had then."""
        entry = self.entries.get(rel)
        if entry and entry.size == st.st_size and entry.mtime_ns == st.st_mtime_ns:
            return entry
        return None

    def put(self, rel: str, st: os.stat_result, md5: str | None, etag: str | None) -> None:
        self.entries[rel] = CacheEntry(st.st_size, st.st_mtime_ns, md5, etag)
        self.dirty = True

    def forget(self, rel: str) -> None:
        if self.entries.pop(rel, None) is not None:
            self.dirty = True

    def save(self, keep: set[str] | None = None) -> None:
        """Write the cache if it changed (``keep``: forget every other path)."""
        if keep is not None and any(k not in keep for k in self.entries):
            self.entries = {k: v for k, v in self.entries.items() if k in keep}
            self.dirty = True
        if not self.dirty:
            return
        files = {rel: list(entry) for rel, entry in self.entries.items()}
        payload = {"version": _FORMAT_VERSION, "root": self.root, "remote": self.remote}
        data = json.dumps({**payload, "files": files}, separators=(",", ":")).encode()
        try:
            write_atomic(self.path, lambda handle: handle.write(data))
        except OSError as exc:  # no writable cache: the next run hashes instead
            log.debug("s3-sync: could not save %s: %s", self.path, exc)
        else:
            self.dirty = False  # a second save() with nothing new writes nothing
            prune_caches(self.path.parent)


def _mark_used(path: Path) -> None:
    """Give ``path`` the time of now: the most recently used cache, the last to be removed."""
    with contextlib.suppress(OSError):  # a read-only cache folder: nothing is written there
        os.utime(path)


def prune_caches(folder: Path) -> None:
    """Remove the least recently used hash caches in ``folder`` beyond ``CACHE_LIMIT`` (best
    effort: another sync may be removing or writing them too). Only cache files are touched."""
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if CACHE_NAME.fullmatch(entry.name):
                    try:
                        found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
                    except OSError:
                        continue  # removed meanwhile
    except OSError:
        return
    if len(found) <= CACHE_LIMIT:
        return
    found.sort(reverse=True)
    for _, path in found[CACHE_LIMIT:]:
        with contextlib.suppress(OSError):  # another sync removed it first
            os.unlink(path)
