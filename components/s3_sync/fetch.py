"""Fetching the objects of a download, verified, durable and atomic.

The calling thread issues requests (at most ``window`` in flight, ``InFlight``). Transfer threads
hand each outcome to ``Arrivals``; one ``Writer`` thread verifies it, writes a small body to its
temp file and passes it to the ``Committer``, which makes a batch of files durable with one
syncfs and only then renames them to their final names.

Results travel in bulk: a transfer thread wakes the writer once per WAKE_BATCH results (the
writer also looks every POLL_SECONDS), and the writer frees room for the issuer once per
WAKE_BATCH handled results. Thousands of small files thus cost a few hundred thread wake-ups
instead of several per file.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from components.s3_sync.connection import S3Connection
from components.s3_sync.engine import PART_SIZE, Engine
from components.s3_sync.engines import make_engine
from components.s3_sync.errors import S3SyncError
from components.s3_sync.hash_cache import HashCache
from components.s3_sync.listing import RemoteObject
from components.s3_sync.local_files import (
    fsync_file,
    new_temp_tag,
    remove_temp,
    syncfs,
    temp_path,
    write_new,
)
from components.s3_sync.options import SyncOptions, SyncReport
from components.s3_sync.progress import Progress
from components.s3_sync.s3_uri import S3Location
from components.s3_sync.streamed_file import StreamedFile
from components.s3_sync.verify import Verifier
from kfp_ddp.atomic_files import fsync_dir

COMMIT_BATCH = 256
"""Verified small downloads made durable together (one syncfs) before their renames."""
WAKE_BATCH = 32
"""Finished downloads that wake the writer thread, and handled ones that wake the issuer."""
POLL_SECONDS = 0.005
"""How often the writer looks for fewer than WAKE_BATCH finished downloads."""


class Target(NamedTuple):
    """An object to fetch and the relative path it gets."""

    obj: RemoteObject
    rel: str


@dataclass(slots=True)
class Fetch:
    """An object on its way: written to ``temp``, renamed to ``rel`` once verified and durable."""

    obj: RemoteObject
    rel: str
    temp: str


class Arrival(NamedTuple):
    """What a transfer thread handed over: the body (see ``engine.OnDownloaded``) or an error."""

    fetch: Fetch
    body: object
    error: BaseException | None


@dataclass(slots=True)
class Verified:
    """A fetched file whose bytes are the object's, waiting for its commit."""

    fetch: Fetch
    md5: str | None
    stat: os.stat_result | None
    """The temp file's stat if we wrote it (saves a stat); a rename keeps it."""
    durable: bool
    """Already fsynced (big files get their own fsync, not a syncfs of everything dirty)."""


class InFlight:
    """Flow control between the issuing thread and the writer: requests issued, results
    handled, and whether more requests will come."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.issued = 0
        self.handled = 0
        self.issuing = True
        self._room = threading.Condition()

    def wait_for_room(self) -> None:
        """Block while ``window`` requests are in flight, until a quarter of it is free."""
        if self.issued - self.handled < self.window:
            return
        with self._room:
            while self.issued - self.handled > self.window - self.window // 4:
                self._room.wait()

    def mark_handled(self, count: int) -> None:
        with self._room:
            self.handled += count
            self._room.notify()

    def outstanding(self) -> bool:
        """Whether a result is still to come (every issued request reports exactly once)."""
        return self.issuing or self.handled < self.issued


class Arrivals:
    """Outcomes handed over in bulk from the transfer threads to the writer."""

    def __init__(self) -> None:
        self._ready: deque[Arrival] = deque()
        self._wake = threading.Event()

    def put(self, fetch: Fetch, body: object, error: BaseException | None) -> None:
        """An engine's ``done`` callback (on a transfer thread)."""
        self._ready.append(Arrival(fetch, body, error))
        if len(self._ready) >= WAKE_BATCH:
            self._wake.set()

    def wait(self) -> None:
        self._wake.wait(POLL_SECONDS)
        self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def take(self) -> Arrival | None:
        return self._ready.popleft() if self._ready else None

    def __len__(self) -> int:
        return len(self._ready)


class Committer:
    """Group commit: verified small files wait in a batch; one syncfs() makes the whole batch
    durable, then they are renamed to their final names. A final name never points at data
    that is not on disk, at one flush per batch instead of one fsync per file."""

    def __init__(self, dest: str, cache: HashCache, report: SyncReport, bar: Progress) -> None:
        self.dest = dest
        self.cache = cache
        self.report = report
        self.bar = bar
        self.batch: list[Verified] = []

    def add(self, item: Verified) -> None:
        if item.durable:
            self.commit([item])
            return
        self.batch.append(item)
        if len(self.batch) >= COMMIT_BATCH:
            self.flush()

    def flush(self) -> None:
        items, self.batch = self.batch, []
        self.commit(items)

    def commit(self, items: list[Verified]) -> None:
        unsynced = [item.fetch.temp for item in items if not item.durable]
        if unsynced and not syncfs(self.dest):  # no syncfs(2) here: one fsync per file
            for temp in unsynced:
                fsync_file(temp)
        for item in items:
            fetch = item.fetch
            final = os.path.join(self.dest, fetch.rel)
            os.replace(fetch.temp, final)  # keeps the mtime: a stat from before is still right
            self.cache.put(fetch.rel, item.stat or os.stat(final), item.md5, fetch.obj.etag)
            self.report.transferred += 1
            self.report.bytes_transferred += fetch.obj.size
            self.bar.file_done()


class Writer:
    """The writer thread: verifies each arrival, writes small bodies to their temp files and
    hands verified files to the committer; failures are collected, their temp files removed."""

    def __init__(
        self,
        *,
        arrivals: Arrivals,
        inflight: InFlight,
        verifier: Verifier,
        committer: Committer,
        failures: list[S3SyncError],
        translate: Callable[[BaseException, str], S3SyncError],
    ) -> None:
        self.arrivals = arrivals
        self.inflight = inflight
        self.verifier = verifier
        self.committer = committer
        self.failures = failures
        self.translate = translate

    def run(self) -> None:
        try:
            while self.inflight.outstanding():
                self.arrivals.wait()
                self._handle_ready()
        finally:
            try:  # verified files are kept even when the sync stops early
                self.committer.flush()
            except OSError as exc:
                self.failures.append(
                    S3SyncError(
                        f"could not move verified downloads into {self.committer.dest}: {exc}"
                    )
                )

    def _handle_ready(self) -> None:
        handled = 0
        while (arrival := self.arrivals.take()) is not None:
            try:
                self._handle(arrival)
            finally:
                handled += 1
            if handled == WAKE_BATCH or not self.arrivals:  # let the issuer refill
                self.inflight.mark_handled(handled)
                handled = 0

    def _handle(self, arrival: Arrival) -> None:
        fetch = arrival.fetch
        try:
            if arrival.error is not None:
                raise arrival.error
            self.committer.add(self._verified(fetch, arrival.body))
        except BaseException as exc:  # noqa: BLE001 - collected and reported by the issuer
            remove_temp(fetch.temp)
            self.failures.append(self.translate(exc, fetch.obj.key))

    def _verified(self, fetch: Fetch, body: object) -> Verified:
        obj, big = fetch.obj, fetch.obj.size >= PART_SIZE
        if isinstance(body, StreamedFile):  # written and hashed as it arrived
            md5 = self.verifier.streamed(obj, body)
            if big:
                fsync_file(fetch.temp)
            return Verified(fetch, md5, None, durable=big)
        if isinstance(body, bytes):  # a small object, in memory: verify, then write it
            md5 = self.verifier.in_memory(obj, body)
            stat = write_new(fetch.temp, body)
            if md5 is None:  # not an MD5 ETag: check the file the usual way
                md5 = self.verifier.file_etag(obj, fetch.temp)
            return Verified(fetch, md5, stat, durable=False)
        # written by the engine: hash it (big files: fsync alongside)
        return Verified(fetch, self.verifier.written(obj, fetch.temp, fsync=big), None, big)


class DownloadTransfer:
    """Fetches the targets of one download into ``dest``."""

    def __init__(
        self,
        *,
        options: SyncOptions,
        conn: S3Connection,
        src: S3Location,
        dest: Path,
        cache: HashCache,
        report: SyncReport,
    ) -> None:
        self.options = options
        self.conn = conn
        self.src = src
        self.dest = str(dest)
        self.cache = cache
        self.report = report
        self.failures: list[S3SyncError] = []
        self.made_dirs: set[str] = set()
        # one random tag per sync; within it the (shortened, digest-suffixed) name is unique
        self.tag = new_temp_tag()

    def run(self, targets: list[Target]) -> None:
        """Fetch every target; raises S3SyncError naming the first failure (verified files are
        kept, failed ones leave nothing behind)."""
        engine = make_engine(
            self.conn, engine=self.options.engine, max_concurrency=self.options.max_concurrency
        )
        self.report.engine = engine.name
        bar = Progress(
            total_files=len(targets),
            total_bytes=sum(t.obj.size for t in targets),
            mode=self.options.progress,
        )
        inflight = InFlight(max(64, self.options.max_concurrency * 8))
        arrivals = Arrivals()
        writer = Writer(
            arrivals=arrivals,
            inflight=inflight,
            verifier=Verifier(self.conn, self.src.bucket),
            committer=Committer(self.dest, self.cache, self.report, bar),
            failures=self.failures,
            translate=lambda exc, key: self.conn.translate(exc, bucket=self.src.bucket, key=key),
        )
        thread = threading.Thread(target=writer.run, name="s3sync-writer", daemon=True)
        thread.start()
        cancelled = True
        try:
            self._issue(engine, targets, inflight, arrivals, bar)
            cancelled = bool(self.failures)
        finally:
            engine.shutdown(cancel=cancelled)
            inflight.issuing = False
            arrivals.wake()
            thread.join()  # every issued request has called back and been handled
            bar.close()
            for folder in self.made_dirs:
                fsync_dir(Path(folder))
            self.cache.save()
        if self.failures:
            raise S3SyncError(
                f"{len(self.failures)} of {len(targets)} download(s) from {self.src.uri} failed; "
                f"first: {self.failures[0]}"
            )

    def _issue(
        self,
        engine: Engine,
        targets: list[Target],
        inflight: InFlight,
        arrivals: Arrivals,
        bar: Progress,
    ) -> None:
        for obj, rel in targets:
            fetch = Fetch(obj, rel, self._temp_for(rel))
            inflight.wait_for_room()
            if self.failures:
                return
            engine.download(
                self.src.bucket,
                obj.key,
                obj.size,
                obj.etag,
                fetch.temp,
                bar.add_bytes,
                partial(arrivals.put, fetch),
            )
            inflight.issued += 1

    def _temp_for(self, rel: str) -> str:
        """The temp path of ``rel`` beside its final name (its folder made on first use)."""
        head, name = os.path.split(rel)
        parent = os.path.join(self.dest, head) if head else self.dest
        if parent not in self.made_dirs:
            os.makedirs(parent, exist_ok=True)
            self.made_dirs.add(parent)
        return temp_path(parent, name, self.tag)
