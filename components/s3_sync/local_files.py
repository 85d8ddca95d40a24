"""The local side: walking a folder without following links out of it, temp names beside the
final files, and making written files durable."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path

log = logging.getLogger("components.s3_sync")

TEMP_RE = re.compile(r"^\..*\.s3sync-[0-9a-f]{8}\.tmp(\.[A-Za-z0-9]{1,16})?$")
"""Names of our temp files (``.NAME.s3sync-XXXXXXXX.tmp``): never data, removed when stale."""
_NAME_LIMIT = 160
"""UTF-8 bytes of a final name kept in its temp name (temp names must fit in 255 bytes)."""


def names_not_utf8(rels) -> list[str]:
    """The relative paths of ``rels`` that are not UTF-8 (S3 keys must be), shown with their
    odd bytes escaped (``'train/a/caf\\xe9.png'``): names made by an archive or a system that
    wrote another encoding, such as Latin-1, which Python reads with surrogate escapes."""
    shown = []
    for rel in rels:
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            shown.append(os.fsencode(rel).decode("utf-8", "backslashreplace"))
    return sorted(shown)


@dataclass(slots=True)
class LocalFile:
    rel: str
    """Path relative to the synced folder, with "/" separators."""
    path: str
    st: os.stat_result


def walk_local(
    root: Path,
    *,
    follow_inside_links: bool,
    refused: list[str] | None,
    clean_temps: bool = False,
) -> dict[str, LocalFile]:
    """Regular files under ``root`` as rel -> LocalFile, without following links out of it.

    Temp files of an interrupted run are skipped (and removed when ``clean_temps``). Symlinked
    files are followed only when ``follow_inside_links`` and they resolve inside ``root``; others
    are reported in ``refused`` (when given). Symlinked folders are never descended into.
    """
    return _Walk(root, follow_inside_links, refused, clean_temps).files()


class _Walk:
    """One walk of ``walk_local``: a stack of folders still to scan and the files found."""

    def __init__(
        self, root: Path, follow_inside_links: bool, refused: list[str] | None, clean_temps: bool
    ) -> None:
        self.root_real = os.path.realpath(root)
        self.follow_inside_links = follow_inside_links
        self.refused = refused
        self.clean_temps = clean_temps
        self.found: dict[str, LocalFile] = {}
        self.stack = [("", str(root))]

    def files(self) -> dict[str, LocalFile]:
        while self.stack:
            rel_dir, abs_dir = self.stack.pop()
            try:
                entries = os.scandir(abs_dir)
            except FileNotFoundError:
                continue
            with entries:
                for entry in entries:
                    try:
                        self._visit(entry, f"{rel_dir}{entry.name}")
                    except OSError as exc:
                        log.warning("s3-sync: skipping %s: %s", entry.path, exc)
        return self.found

    def _visit(self, entry: os.DirEntry, rel: str) -> None:
        if TEMP_RE.match(entry.name):
            if self.clean_temps:  # destination side: a leftover of an interrupted run
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
        elif entry.is_symlink():
            self._visit_link(entry, rel)
        elif entry.is_dir(follow_symlinks=False):
            self.stack.append((rel + "/", entry.path))
        elif entry.is_file(follow_symlinks=False):
            self.found[rel] = LocalFile(rel, entry.path, entry.stat(follow_symlinks=False))

    def _visit_link(self, entry: os.DirEntry, rel: str) -> None:
        target = os.path.realpath(entry.path)
        inside = target.startswith(self.root_real + os.sep)
        if self.follow_inside_links and inside and os.path.isfile(target):
            self.found[rel] = LocalFile(rel, entry.path, os.stat(entry.path))
        elif self.refused is not None:
            log.warning("s3-sync: not following symlink %s -> %s", rel, target)
            self.refused.append(rel)
        elif not entry.is_dir():
            # destination side: a link is a "file" we may replace or delete
            self.found[rel] = LocalFile(rel, entry.path, entry.stat(follow_symlinks=False))


def new_temp_tag() -> str:
    """One random tag per sync keeps its temp names apart from another sync's in the folder."""
    return secrets.token_hex(4)


def temp_path(parent: str, name: str, tag: str) -> str:
    """The temp file in ``parent`` that becomes ``name`` once verified and durable."""
    return os.path.join(parent, f".{_short(name)}.s3sync-{tag}.tmp")


def _short(name: str, limit: int = _NAME_LIMIT) -> str:
    """``name`` cut to at most ``limit`` UTF-8 bytes; a cut name ends with a digest of the
    whole name, so two long names never share a temp name."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= limit:
        return name
    digest = hashlib.blake2s(raw, digest_size=4).hexdigest()
    return raw[: limit - 9].decode("utf-8", "ignore") + "~" + digest


def remove_temp(temp: str) -> None:
    """Remove a temp file and anything an engine wrote beside it under that name."""
    head, name = os.path.split(temp)
    for leftover in Path(head).glob(f"{glob_escape(name)}*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def write_new(path: str, data: bytes) -> os.stat_result:
    """Create ``path`` (it must not exist) holding ``data``; returns its stat. Not fsynced: the
    caller makes it durable (see ``syncfs``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return os.fstat(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def syncfs(folder: str | os.PathLike) -> bool:
    """Flush the file system holding ``folder`` (Linux syncfs(2)); False where unavailable."""
    import ctypes  # ~3 ms: on first use, not at start-up

    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        return call(fd) == 0
    finally:
        os.close(fd)
