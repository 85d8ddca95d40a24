"""S3 → local folder: list and walk, decide what to fetch, refuse and delete, then fetch.

*Unchanged* means same size and same ETag; a local file's ETag comes from the hash cache, or
from hashing it (no request either way). Keys that would land outside the destination (``..``
segments, absolute paths, backslashes, NUL, empty or ``.`` segments, a path through a symlink,
a file where a folder is needed) are refused, reported and never written. ``delete`` removes
only files (and the folders that this empties) under the destination folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from components.s3_sync.archived import check_archived
from components.s3_sync.connection import S3Connection
from components.s3_sync.delete_guard import PlannedDeletions, check_deletions
from components.s3_sync.disk_room import check_room
from components.s3_sync.errors import S3SyncError
from components.s3_sync.fetch import DownloadTransfer, Target
from components.s3_sync.hash_cache import HashCache
from components.s3_sync.hashing import (
    ETag,
    content_etag,
    matching_multipart_etag,
    multipart_candidates,
)
from components.s3_sync.listing import RemoteObject, list_objects
from components.s3_sync.local_files import LocalFile, walk_local
from components.s3_sync.one_object import check_not_one_object
from components.s3_sync.options import SyncOptions, SyncReport
from components.s3_sync.s3_uri import S3Location
from components.s3_sync.selection import (
    listing_digest,
    parents,
    path_problem,
    safe_relative_path,
    stays_inside,
)

log = logging.getLogger("components.s3_sync")


@dataclass
class DownloadPlan:
    """What a download will do, decided before anything changes."""

    wanted: dict[str, RemoteObject] = field(default_factory=dict)
    """Relative path → the object it holds after the sync (fetched or unchanged)."""
    folders: set[str] = field(default_factory=set)
    """Folder markers (keys ending in "/"): folders, never files."""
    fetch: list[Target] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    """Local files (relative paths) that ``delete`` removes."""
    refused: list[str] = field(default_factory=list)
    skipped: int = 0

    def needed_folders(self) -> set[str]:
        """Folders the source has: never removed when a deletion empties them."""
        needed = {p for rel in self.wanted for p in parents(rel)}
        return needed | {p for d in self.folders for p in (*parents(d), d)}


class DownloadJob:
    def __init__(
        self, options: SyncOptions, conn: S3Connection, engine: str, src: S3Location, dest: Path
    ) -> None:
        self.options = options
        self.conn = conn
        self.engine = engine
        self.src = src
        self.dest = dest
        self.report = SyncReport(
            dry_run=options.dry_run, source=options.source, destination=options.destination
        )

    def run(self) -> SyncReport:
        options, report = self.options, self.report
        if self.dest.exists() and not self.dest.is_dir():
            raise S3SyncError(f"destination {str(self.dest)!r} exists and is not a folder")
        listing, local, cache = self._list_and_walk()
        if not listing:
            check_not_one_object(self.conn, self.src)
        objects = [ob for ob in listing if ob.rel and options.selects(ob.rel)]
        report.files = len(objects)
        report.bytes_total = sum(ob.size for ob in objects)
        report.digest = listing_digest((ob.rel, ob.size, ob.etag) for ob in objects)
        plan = self._plan(objects, local, cache)
        report.refused, report.skipped = plan.refused, plan.skipped
        check_archived(self.conn, self.src.bucket, self.src.uri, [t.obj for t in plan.fetch])
        if options.delete:
            existing = sum(1 for rel in local if options.selects(rel))
            check_deletions(
                PlannedDeletions(
                    source=self.src.uri,
                    destination=str(self.dest),
                    source_files=len(objects),
                    existing=existing,
                    paths=tuple(plan.delete),
                    dry_run=options.dry_run,
                ),
                options.delete_limit,
            )
        if not options.dry_run:
            check_room(self.dest, plan.fetch)
        if options.dry_run:
            report.would_transfer = [target.rel for target in plan.fetch]
            report.would_delete = list(plan.delete)
            report.transferred = len(plan.fetch)
            report.bytes_transferred = sum(target.obj.size for target in plan.fetch)
            report.deleted = len(plan.delete)
            return report
        self._apply(plan, cache)
        return report

    def _list_and_walk(self) -> tuple[list[RemoteObject], dict[str, LocalFile], HashCache]:
        """The listing, and meanwhile (it waits on the network) the destination's files."""
        with ThreadPoolExecutor(1, thread_name_prefix="s3sync-list") as lister:
            listed = lister.submit(list_objects, self.conn, self.src, engine=self.engine)
            try:
                local = {}
                if self.dest.is_dir():
                    local = walk_local(
                        self.dest,
                        follow_inside_links=False,
                        refused=None,
                        clean_temps=not self.options.dry_run,
                    )
                cache = HashCache(self.dest, self.src.uri)
            finally:
                listing = listed.result()
        return listing, local, cache

    def _plan(
        self, objects: list[RemoteObject], local: dict[str, LocalFile], cache: HashCache
    ) -> DownloadPlan:
        plan = DownloadPlan()
        for ob in objects:
            rel = safe_relative_path(ob.rel)
            if rel is None:
                self._refuse(plan, ob, f"{path_problem(ob.rel)}: no path under {self.dest}")
            elif rel in plan.wanted and not ob.rel.endswith("/"):
                self._refuse(plan, ob, "another key lands on the same file")
            elif ob.rel.endswith("/"):  # folder marker: a folder, never a file
                plan.folders.add(rel)
            else:
                plan.wanted[rel] = ob
        # Clashes between a file and a folder of the same name ("a" and "a/b"): refuse the file.
        folders = {p for rel in plan.wanted for p in parents(rel)} | plan.folders
        for rel in sorted(set(plan.wanted) & folders):
            self._refuse(plan, plan.wanted.pop(rel), "a folder of that name is needed")
        dest_real = os.path.realpath(self.dest)
        for rel, ob in plan.wanted.items():
            lf = local.get(rel)
            if not stays_inside(dest_real, self.dest, rel):
                self._refuse(plan, ob, "path goes through a symlink")
            elif lf is not None and unchanged(lf, ob, cache):
                plan.skipped += 1
            else:
                plan.fetch.append(Target(ob, rel))
        if self.options.delete:
            selects = self.options.selects
            plan.delete = [rel for rel in local if rel not in plan.wanted and selects(rel)]
        return plan

    def _refuse(self, plan: DownloadPlan, ob: RemoteObject, why: str) -> None:
        log.warning("s3-sync: refusing key %r (%s)", ob.key, why)
        plan.refused.append(ob.key)

    def _apply(self, plan: DownloadPlan, cache: HashCache) -> None:
        self.dest.mkdir(parents=True, exist_ok=True)
        dest_real = os.path.realpath(self.dest)
        for folder in sorted(plan.folders):
            if stays_inside(dest_real, self.dest, folder):
                try:
                    (self.dest / folder).mkdir(parents=True, exist_ok=True)
                except OSError as exc:  # a file stands where the folder marker wants a folder
                    log.warning("s3-sync: cannot create folder %s: %s", self.dest / folder, exc)
        if plan.fetch:
            DownloadTransfer(
                options=self.options,
                conn=self.conn,
                src=self.src,
                dest=self.dest,
                cache=cache,
                report=self.report,
            ).run(plan.fetch)
        self._delete(plan, cache)
        cache.save(keep=set(plan.wanted))

    def _delete(self, plan: DownloadPlan, cache: HashCache) -> None:
        """Remove ``plan.delete``, then the folders that this emptied (not those the source
        has, nor those that still hold unselected files)."""
        for rel in plan.delete:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dest / rel)
                self.report.deleted += 1
                cache.forget(rel)
        if not plan.delete:
            return
        emptied = {p for rel in plan.delete for p in parents(rel)} - plan.needed_folders()
        for folder in sorted(emptied, key=lambda p: p.count("/"), reverse=True):
            with contextlib.suppress(OSError):  # not empty (e.g. unselected files): kept
                os.rmdir(self.dest / folder)


def unchanged(lf: LocalFile, ob: RemoteObject, cache: HashCache) -> bool:
    """Whether the local file already holds the object's bytes: the cache says so, or (no or a
    stale record) its hash does, which costs a read and no request."""
    if not stat.S_ISREG(lf.st.st_mode) or lf.st.st_size != ob.size:
        return False
    cached = cache.get(lf.rel, lf.st)
    if cached is not None and cached.etag == ob.etag:
        return True
    etag = ETag.parse(ob.etag)
    if etag is None:
        return False
    if etag.parts is None:
        same, md5 = content_etag(lf.path, part_size=None) == ob.etag, ob.etag
    else:
        sizes = multipart_candidates(ob.size, etag.parts)
        same, md5 = matching_multipart_etag(lf.path, ob.size, ob.etag, sizes), None
    if same:
        cache.put(lf.rel, lf.st, md5, ob.etag)
    return same
