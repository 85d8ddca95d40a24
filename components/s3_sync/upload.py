"""Local folder → S3: walk and list, decide what to send, refuse and delete, then send.

A file's content id is the ETag our upload gives it (MD5 below PART_SIZE, else
``md5-of-part-md5s-N`` for PART_SIZE parts), from the hash cache or hashed. Uploads never follow
a symlink out of the source folder; ``delete`` removes only keys under the destination prefix.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from components.s3_sync.connection import S3Connection
from components.s3_sync.delete_guard import PlannedDeletions, check_deletions
from components.s3_sync.engine import PART_SIZE
from components.s3_sync.engines import make_engine
from components.s3_sync.errors import S3SyncError
from components.s3_sync.hash_cache import CacheEntry, HashCache
from components.s3_sync.hashing import (
    ETag,
    content_etag,
    local_content_id,
    matching_multipart_etag,
    multipart_candidates,
)
from components.s3_sync.listing import RemoteObject, list_objects
from components.s3_sync.local_files import LocalFile, names_not_utf8, walk_local
from components.s3_sync.options import SyncOptions, SyncReport
from components.s3_sync.progress import Progress
from components.s3_sync.s3_uri import S3Location
from components.s3_sync.selection import listing_digest


class Send(NamedTuple):
    """A file to upload and its content id (the ETag the object will get)."""

    file: LocalFile
    content_id: str


class Sending(NamedTuple):
    send: Send
    future: Future


class UploadJob:
    def __init__(
        self, options: SyncOptions, conn: S3Connection, engine: str, src: Path, dst: S3Location
    ) -> None:
        self.options = options
        self.conn = conn
        self.engine = engine
        self.src = src
        self.dst = dst
        self.report = SyncReport(
            dry_run=options.dry_run, source=options.source, destination=options.destination
        )

    def run(self) -> SyncReport:
        options, report = self.options, self.report
        if not self.src.is_dir():
            raise S3SyncError(
                f"source folder {str(self.src)!r} does not exist or is not a folder; "
                "pass an existing local folder or an s3:// URI"
            )
        refused: list[str] = []
        local, listing, cache = self._walk_and_list(refused)
        report.refused = [r for r in refused if options.selects(r)]
        files = {rel: lf for rel, lf in local.items() if options.selects(rel)}
        self._refuse_names_not_utf8(files)
        remote = {ob.rel: ob for ob in listing}
        sends = self._decide(files, remote, cache)
        report.files = len(files)
        report.bytes_total = sum(lf.st.st_size for lf in files.values())
        deletions = self._deletions(files, remote)
        if self.options.dry_run:
            report.would_transfer = [send.file.rel for send in sends]
            report.would_delete = [key[len(self.dst.prefix) :] for key in deletions]
            report.transferred = len(sends)
            report.bytes_transferred = sum(send.file.st.st_size for send in sends)
            report.deleted = len(deletions)
            return report
        try:
            if sends:
                self._transfer(sends, cache)
            if deletions:
                self.conn.delete_keys(self.dst.bucket, deletions)
                report.deleted = len(deletions)
        finally:
            cache.save(keep=set(files))
        return report

    def _refuse_names_not_utf8(self, files: dict[str, LocalFile]) -> None:
        """Before anything is sent: a file whose name is not UTF-8 has no S3 key (it failed
        the upload part-way with a UnicodeEncodeError)."""
        odd = names_not_utf8(files)
        if odd:
            shown = ", ".join(f"'{name}'" for name in odd[:5])
            more = f" and {len(odd) - 5} more" if len(odd) > 5 else ""
            raise S3SyncError(
                f"{len(odd)} file name(s) under {str(self.src)!r} are not UTF-8, which S3 keys "
                f"must be: {shown}{more}; rename them to UTF-8 (from Latin-1, for example: "
                f"convmv -f latin1 -t utf8 -r --notest {str(self.src)!r}); nothing was uploaded"
            )

    def _walk_and_list(
        self, refused: list[str]
    ) -> tuple[dict[str, LocalFile], list[RemoteObject], HashCache]:
        """The source's files and hash cache, and meanwhile (it waits on the network) the
        listing of the destination."""
        with ThreadPoolExecutor(1, thread_name_prefix="s3sync-list") as lister:
            listed = lister.submit(list_objects, self.conn, self.dst, engine=self.engine)
            try:
                local = walk_local(self.src, follow_inside_links=True, refused=refused)
                cache = HashCache(self.src, self.dst.uri)
            finally:
                listing = listed.result()
        return local, listing, cache

    def _decide(
        self, files: dict[str, LocalFile], remote: dict[str, RemoteObject], cache: HashCache
    ) -> list[Send]:
        """The files to send (the rest are unchanged: counted as skipped); sets the digest."""
        sends: list[Send] = []
        digest_entries = []
        for rel, lf in files.items():
            size = lf.st.st_size
            cached = cache.get(rel, lf.st)
            cid = _cached_content_id(cached, size) or local_content_id(lf.path, size)
            digest_entries.append((rel, size, cid))
            ob = remote.get(rel)
            known = ob is not None and cached is not None and cached.etag == ob.etag
            if ob is not None and ob.size == size and (known or _holds(ob, lf, cid)):
                if not known:
                    cache.put(rel, lf.st, cid, ob.etag)
                self.report.skipped += 1
            else:
                sends.append(Send(lf, cid))
        self.report.digest = listing_digest(digest_entries)
        return sends

    def _deletions(self, files: dict[str, LocalFile], remote: dict[str, RemoteObject]) -> list[str]:
        """Keys that ``delete`` removes, once the guard agreed."""
        if not self.options.delete:
            return []
        selects = self.options.selects
        existing = [ob for rel, ob in remote.items() if selects(rel)]
        keys = [ob.key for ob in existing if ob.rel not in files]
        check_deletions(
            PlannedDeletions(
                source=str(self.src),
                destination=self.dst.uri,
                source_files=len(files),
                existing=len(existing),
                paths=tuple(key[len(self.dst.prefix) :] for key in keys),
                unit="objects",
                dry_run=self.options.dry_run,
            ),
            self.options.delete_limit,
        )
        return keys

    def _transfer(self, sends: list[Send], cache: HashCache) -> None:
        options = self.options
        engine = make_engine(
            self.conn, engine=options.engine, max_concurrency=options.max_concurrency
        )
        self.report.engine = engine.name
        bar = Progress(
            total_files=len(sends),
            total_bytes=sum(send.file.st.st_size for send in sends),
            mode=options.progress,
        )
        failures: list[S3SyncError] = []
        pending: deque[Sending] = deque()
        window = max(64, options.max_concurrency * 8)
        cancelled = True
        try:
            for send in sends:
                # below PART_SIZE the content id is the MD5: sent as Content-MD5, checked by S3
                key = self.dst.prefix + send.file.rel
                future = engine.upload(
                    send.file.path,
                    self.dst.bucket,
                    key,
                    send.file.st.st_size,
                    send.content_id,
                    bar.add_bytes,
                )
                pending.append(Sending(send, future))
                while len(pending) > window:
                    self._finish(pending.popleft(), cache, bar, failures)
            while pending:
                self._finish(pending.popleft(), cache, bar, failures)
            cancelled = False
        finally:
            engine.shutdown(cancel=cancelled)
            bar.close()
        if failures:
            raise S3SyncError(
                f"{len(failures)} of {len(sends)} upload(s) to {self.dst.uri} failed; first: "
                f"{failures[0]}"
            )

    def _finish(
        self, sending: Sending, cache: HashCache, bar: Progress, failures: list[S3SyncError]
    ) -> None:
        """Wait for one upload; record it, or its failure."""
        lf = sending.send.file
        try:
            sending.future.result()
        except BaseException as exc:  # noqa: BLE001 - collected and reported by _transfer
            key = self.dst.prefix + lf.rel
            failures.append(self.conn.translate(exc, bucket=self.dst.bucket, key=key))
            return
        cid = sending.send.content_id
        cache.put(lf.rel, lf.st, cid, cid)  # our upload gives the object ETag == content id
        self.report.transferred += 1
        self.report.bytes_transferred += lf.st.st_size
        bar.file_done()


def _cached_content_id(entry: CacheEntry | None, size: int) -> str | None:
    """The cached content id, if it is the one our upload gives a file of this size: an MD5
    below PART_SIZE, our multipart ETag from PART_SIZE on (for a big file that a download wrote
    the cache holds its plain MD5, which is not)."""
    if entry is None or not entry.md5:
        return None
    return entry.md5 if ("-" in entry.md5) == (size >= PART_SIZE) else None


def _holds(ob: RemoteObject, lf: LocalFile, cid: str) -> bool:
    """Does the remote object (same size) hold this file's bytes? Hashes, no request."""
    if ob.etag == cid:
        return True
    etag = ETag.parse(ob.etag)
    if etag is None:
        return False
    size = lf.st.st_size
    if etag.parts is None:  # remote is single-part: compare whole-file MD5s
        return size >= PART_SIZE and content_etag(lf.path, part_size=None) == ob.etag
    sizes = [ps for ps in multipart_candidates(size, etag.parts) if ps != PART_SIZE]
    return matching_multipart_etag(lf.path, size, ob.etag, sizes)
