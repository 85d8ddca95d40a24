"""``sync(source, destination)``: incremental, verified, atomic sync between S3 and a folder.

How it decides, in one listing pass of each side:

- *Unchanged* means same size and same ETag. For a local file the ETag is computed from its bytes
  (MD5, or the multipart ``md5-of-part-md5s-N``) and remembered in a small state file in the user
  cache (``$S3SYNC_CACHE_DIR``, else ``~/.cache/kfp-ddp/s3-sync``; one JSON per local folder, never
  inside it) keyed by (relative path, size, mtime_ns), so a re-run with nothing changed stats
  files, reads no data and sends no GET/PUT. Without the cache (a fresh pod) files whose size
  matches are hashed instead: still no request.
- *Integrity*: a download is checked before it gets its final name: size, then the ETag (MD5
  for single-part objects, ``md5-of-part-md5s-N`` for multipart ones; where the ETag is no MD5,
  S3 checksums and ``If-Match`` are checked on the way by the CRT/botocore). Small objects are
  checked in memory and then written to a temp name in the destination folder; bigger ones
  stream into the temp file and are hashed as they arrive. Verified files are made durable
  (one syncfs per batch of small files, an fsync per big one) and only then renamed. Temp files
  left by an interrupted run are removed by the next run, which fetches those objects again. An
  upload carries Content-MD5 / CRC32 that the server checks.
- *Safety*: keys that would land outside the destination (``..`` segments, absolute paths,
  backslashes, NUL, empty or ``.`` segments, or a path through a symlink) are refused, reported
  and never written. Uploads never follow a symlink out of the source folder. ``delete`` only
  removes files (and the folders that this empties) under the destination folder / keys under
  the destination prefix.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from glob import escape as glob_escape
from pathlib import Path

from components.s3_sync.progress import Progress
from components.s3_sync.transport import (
    PART_SIZE,
    RemoteObject,
    S3Connection,
    S3Location,
    S3SyncError,
    StreamedFile,
    make_engine,
    multipart_candidates,
    parse_s3_uri,
)

log = logging.getLogger("components.s3_sync")

CACHE_ENV = "S3SYNC_CACHE_DIR"
"""Env var naming the folder for the hash caches (default ``~/.cache/kfp-ddp/s3-sync``)."""
_TEMP_RE = re.compile(r"^\..*\.s3sync-[0-9a-f]{8}\.tmp(\.[A-Za-z0-9]{1,16})?$")
_ETAG_RE = re.compile(r"^([0-9a-f]{32})(?:-(\d+))?$")
_HASH_CHUNK = 4 * 1024 * 1024
_ENGINES = ("auto", "crt", "classic")
_ADDRESSING = ("auto", "path", "virtual")


@dataclass(kw_only=True)
class SyncOptions:
    """Everything one sync needs; the CLI, the KFP component and the tests build this object."""

    source: str
    """``s3://bucket/prefix`` or a local folder."""
    destination: str
    """``s3://bucket/prefix`` or a local folder (exactly one side is S3)."""
    endpoint_url: str | None = None
    """S3 endpoint; None: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / AWS config / AWS itself."""
    include: Sequence[str] = ()
    """Globs on the key relative to the prefix; if any are given only matching keys sync."""
    exclude: Sequence[str] = ()
    """Globs on the relative key; matching keys are neither transferred nor deleted."""
    filters: Sequence[tuple[str, str]] = ()
    """Ordered ``("include" | "exclude", glob)`` pairs with ``aws s3 sync`` semantics: every key
    is selected to begin with, each filter that matches a key includes or excludes it, and the
    last match wins (``exclude *`` then ``include *.png`` selects only PNGs). The CLI's
    ``--include``/``--exclude`` flags become these, in command-line order. Not together with
    ``include``/``exclude``."""
    delete: bool = False
    """Remove destination files/objects that are not in the source (only under the destination)."""
    dry_run: bool = False
    """Plan and report, change nothing."""
    region: str | None = None
    """Region for signing; None: AWS_REGION / AWS_DEFAULT_REGION / config (else us-east-1)."""
    addressing_style: str | None = None
    """``path``, ``virtual`` or ``auto``; None: from the AWS config (botocore's default)."""
    max_concurrency: int = 32
    """Transfers in flight at once."""
    progress: bool | None = None
    """True: tqdm bar; False: periodic log lines; None: a bar on a TTY, log lines otherwise."""
    engine: str = "auto"
    """``crt`` (AWS CRT), ``classic`` (botocore threads) or ``auto`` (CRT when installed)."""

    def __post_init__(self) -> None:
        # a lone string is one pattern, not a sequence of one-character patterns
        self.include = (self.include,) if isinstance(self.include, str) else tuple(self.include)
        self.exclude = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude)
        src_s3 = str(self.source).startswith("s3://")
        dst_s3 = str(self.destination).startswith("s3://")
        if src_s3 == dst_s3:
            raise S3SyncError(
                f"source={self.source!r}, destination={self.destination!r}: exactly one side "
                "must be an s3://bucket/prefix URI and the other a local folder"
            )
        if self.max_concurrency < 1:
            raise S3SyncError(f"max_concurrency={self.max_concurrency} must be >= 1")
        if self.engine not in _ENGINES:
            raise S3SyncError(f"engine={self.engine!r} is not one of {', '.join(_ENGINES)}")
        if self.addressing_style is not None and self.addressing_style not in _ADDRESSING:
            raise S3SyncError(
                f"addressing_style={self.addressing_style!r} is not one of {', '.join(_ADDRESSING)}"
            )
        self.filters = tuple(tuple(f) for f in self.filters)
        if self.filters and (self.include or self.exclude):
            raise S3SyncError(
                "filters= (ordered, aws-style) cannot be combined with include=/exclude=; "
                "express the includes and excludes as filters"
            )
        for kind, _ in self.filters:
            if kind not in ("include", "exclude"):
                raise S3SyncError(f"filter kind {kind!r} must be 'include' or 'exclude'")
        for pattern in (*self.include, *self.exclude, *(g for _, g in self.filters)):
            if not isinstance(pattern, str) or not pattern:
                raise S3SyncError(f"include/exclude pattern {pattern!r} must be a non-empty glob")

    def selects(self, rel: str) -> bool:
        """Whether the key/path ``rel`` (relative to the prefix/folder) takes part in the sync."""
        if self.filters:
            chosen = True
            for kind, pattern in self.filters:
                if fnmatch.fnmatchcase(rel, pattern):
                    chosen = kind == "include"
            return chosen
        return selected(rel, self.include, self.exclude)

    @property
    def download(self) -> bool:
        return str(self.source).startswith("s3://")


@dataclass
class SyncReport:
    """What a sync did (or, with dry_run, would do)."""

    transferred: int = 0
    """Objects/files copied (or that would be, with dry_run)."""
    skipped: int = 0
    """Unchanged, not copied."""
    deleted: int = 0
    """Removed from the destination (``delete=True``)."""
    refused: list[str] = field(default_factory=list)
    """Source keys/paths refused for safety (outside the destination, symlinks out, clashes)."""
    files: int = 0
    """Objects/files in the source selection."""
    bytes_transferred: int = 0
    bytes_total: int = 0
    """Bytes in the source selection."""
    seconds: float = 0.0
    digest: str = ""
    """sha256 of the source listing (relative key, size, ETag): changes exactly with the data."""
    dry_run: bool = False
    source: str = ""
    destination: str = ""
    engine: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        verb = "would transfer" if self.dry_run else "transferred"
        rate = self.bytes_transferred / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{verb} {self.transferred} of {self.files} files ({_human(self.bytes_transferred)} "
            f"of {_human(self.bytes_total)}, {_human(rate)}/s), skipped {self.skipped} unchanged, "
            f"deleted {self.deleted}, refused {len(self.refused)} in {self.seconds:.2f}s; "
            f"digest {self.digest[:16]}"
        )


def sync(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    endpoint_url: str | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    filters: Sequence[tuple[str, str]] = (),
    delete: bool = False,
    dry_run: bool = False,
    region: str | None = None,
    addressing_style: str | None = None,
    max_concurrency: int = 32,
    progress: bool | None = None,
    engine: str = "auto",
) -> SyncReport:
    """Sync ``source`` to ``destination`` (one is ``s3://bucket/prefix``, the other a folder).

    Raises:
        S3SyncError: with one message naming the bucket/endpoint/path and what to check.
    """
    options = SyncOptions(
        source=str(source),
        destination=str(destination),
        endpoint_url=endpoint_url,
        include=include,
        exclude=exclude,
        filters=filters,
        delete=delete,
        dry_run=dry_run,
        region=region,
        addressing_style=addressing_style,
        max_concurrency=max_concurrency,
        progress=progress,
        engine=engine,
    )
    return run_sync(options)


def run_sync(options: SyncOptions) -> SyncReport:
    """Run the sync described by ``options``."""
    started = time.monotonic()
    try:
        conn = S3Connection(
            endpoint_url=options.endpoint_url,
            region=options.region,
            addressing_style=options.addressing_style,
            max_concurrency=options.max_concurrency,
            engine=options.engine,
        )
    except S3SyncError:
        raise
    except Exception as exc:  # botocore: "Invalid endpoint: ...", ProfileNotFound, ...
        if type(exc).__name__ == "ProfileNotFound":
            raise S3SyncError(f"{exc}; check AWS_PROFILE and the AWS config file") from exc
        raise S3SyncError(
            f"endpoint_url={options.endpoint_url!r} is not usable ({exc}); pass a URL like "
            "http://127.0.0.1:8333 or https://s3.us-east-1.amazonaws.com"
        ) from exc
    if options.download:
        job = _Download(options, conn, parse_s3_uri(options.source), Path(options.destination))
    else:
        job = _Upload(options, conn, Path(options.source), parse_s3_uri(options.destination))
    try:
        report = job.run()
    except OSError as exc:
        local = options.destination if options.download else options.source
        raise S3SyncError(
            f"local I/O error in {local!r}: {exc}; check that the folder is writable, has free "
            "space and that no file stands where a folder is needed (or vice versa)"
        ) from exc
    report.seconds = time.monotonic() - started
    log.debug("s3-sync: %s", report.summary())
    return report


# -- selection, safety, digest --------------------------------------------------------------
def selected(rel: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """A key syncs if it matches an include glob (or there are none) and no exclude glob."""
    if include and not any(fnmatch.fnmatchcase(rel, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(rel, p) for p in exclude)


def safe_relative_path(rel: str) -> str | None:
    """The local relative path for key suffix ``rel``, or None if it must be refused.

    Refused: empty, absolute, containing a backslash or NUL, or with an empty, ``.`` or ``..``
    segment (a trailing ``/`` is a folder marker and allowed).
    """
    if not rel or "\\" in rel or "\x00" in rel or rel.startswith("/"):
        return None
    parts = rel[:-1].split("/") if rel.endswith("/") else rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    if re.match(r"^[A-Za-z]:", parts[0]):  # a Windows drive ("C:") is absolute there
        return None
    return "/".join(parts)


def listing_digest(entries: Iterable[tuple[str, int, str]]) -> str:
    """sha256 over sorted (relative key, size, ETag) lines."""
    h = hashlib.sha256()
    for rel, size, etag in sorted(entries):
        h.update(f"{rel}\t{size}\t{etag}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def content_etag(path: str | os.PathLike, *, part_size: int | None) -> str:
    """The S3 ETag the file's bytes get: MD5, or md5-of-part-md5s-N when ``part_size`` is set
    and the file has more than one part of that size."""
    return file_hashes(path, part_size=part_size)[1]


def file_hashes(path: str | os.PathLike, *, part_size: int | None) -> tuple[str, str]:
    """(MD5 of the whole file, its S3 ETag for ``part_size``) in one read."""
    whole = hashlib.md5(usedforsecurity=False)
    parts: list[bytes] = []
    part = hashlib.md5(usedforsecurity=False)
    in_part = 0
    with open(path, "rb") as fh:
        while True:
            want = _HASH_CHUNK if part_size is None else min(_HASH_CHUNK, part_size - in_part)
            chunk = fh.read(want)
            if not chunk:
                break
            whole.update(chunk)
            if part_size is not None:
                part.update(chunk)
                in_part += len(chunk)
                if in_part == part_size:
                    parts.append(part.digest())
                    part = hashlib.md5(usedforsecurity=False)
                    in_part = 0
    if part_size is not None and in_part:
        parts.append(part.digest())
    md5 = whole.hexdigest()
    if part_size is None or len(parts) <= 1:
        return md5, md5
    return md5, f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def local_content_id(path: str | os.PathLike, size: int) -> str:
    """The ETag our upload gives this file: MD5 below PART_SIZE, else md5-of-part-md5s-N."""
    if size < PART_SIZE:
        return content_etag(path, part_size=None)
    return multipart_etag_parallel(path, size, PART_SIZE)


# -- local state cache ----------------------------------------------------------------------
def state_path(root: str | os.PathLike) -> Path:
    """Where the hash cache of local folder ``root`` lives (outside the folder)."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "kfp-ddp", "s3-sync")
    real = os.path.realpath(root)
    name = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return Path(base) / f"{name}.json"


class StateCache:
    """``rel -> [size, mtime_ns, md5, etag]`` for files of one local folder (best effort)."""

    def __init__(self, root: Path, remote: str) -> None:
        self.path = state_path(root)
        self.root = os.path.realpath(root)
        self.remote = remote
        self.entries: dict[str, list] = {}
        self.dirty = False
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") == 1 and data.get("root") == self.root:
                self.entries = {k: v for k, v in data.get("files", {}).items() if len(v) == 4}
        except (OSError, ValueError, AttributeError):
            pass

    def get(self, rel: str, st: os.stat_result) -> list | None:
        entry = self.entries.get(rel)
        if entry and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            return entry
        return None

    def put(self, rel: str, st: os.stat_result, md5: str | None, etag: str | None) -> None:
        self.entries[rel] = [st.st_size, st.st_mtime_ns, md5, etag]
        self.dirty = True

    def save(self, keep: set[str] | None = None) -> None:
        """Write the cache if it changed (``keep``: forget every other path)."""
        if keep is not None and any(k not in keep for k in self.entries):
            self.entries = {k: v for k, v in self.entries.items() if k in keep}
            self.dirty = True
        if not self.dirty:
            return
        from trainer.atomic_files import write_atomic

        payload = {"version": 1, "root": self.root, "remote": self.remote, "files": self.entries}
        data = json.dumps(payload, separators=(",", ":")).encode()
        try:
            write_atomic(self.path, lambda handle: handle.write(data))
        except OSError as exc:  # no writable cache: the next run hashes instead
            log.debug("s3-sync: could not save %s: %s", self.path, exc)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


@dataclass
class _LocalFile:
    rel: str
    path: str
    st: os.stat_result


def _walk_local(
    root: Path,
    *,
    follow_inside_links: bool,
    refused: list[str] | None,
    clean_temps: bool = False,
) -> dict:
    """Regular files under ``root`` as rel -> _LocalFile, without following links out of it.

    Temp files of an interrupted run are skipped (and removed when ``clean_temps``). Symlinked
    files are followed only when ``follow_inside_links`` and they resolve inside ``root``; others
    are reported in ``refused`` (when given). Symlinked folders are never descended into.
    """
    out: dict[str, _LocalFile] = {}
    root_real = os.path.realpath(root)
    stack = [("", str(root))]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            it = os.scandir(abs_dir)
        except FileNotFoundError:
            continue
        with it:
            for entry in it:
                name = entry.name
                rel = f"{rel_dir}{name}"
                if _TEMP_RE.match(name):
                    if clean_temps:  # destination side: a leftover of an interrupted run
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
                    continue
                try:
                    if entry.is_symlink():
                        target = os.path.realpath(entry.path)
                        inside = target.startswith(root_real + os.sep)
                        if follow_inside_links and inside and os.path.isfile(target):
                            out[rel] = _LocalFile(rel, entry.path, os.stat(entry.path))
                        elif refused is not None:
                            log.warning("s3-sync: not following symlink %s -> %s", rel, target)
                            refused.append(rel)
                        elif not entry.is_dir():
                            # destination side: a link is a "file" we may replace or delete
                            out[rel] = _LocalFile(
                                rel, entry.path, entry.stat(follow_symlinks=False)
                            )
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((rel + "/", entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        out[rel] = _LocalFile(rel, entry.path, entry.stat(follow_symlinks=False))
                except OSError as exc:
                    log.warning("s3-sync: skipping %s: %s", entry.path, exc)
    return out


# -- download ------------------------------------------------------------------------------
class _Download:
    def __init__(self, options: SyncOptions, conn: S3Connection, src: S3Location, dest: Path):
        self.o = options
        self.conn = conn
        self.src = src
        self.dest = dest
        self.report = SyncReport(
            dry_run=options.dry_run, source=options.source, destination=options.destination
        )

    def run(self) -> SyncReport:
        o, report = self.o, self.report
        if self.dest.exists() and not self.dest.is_dir():
            raise S3SyncError(f"destination {str(self.dest)!r} exists and is not a folder")
        # The listing waits on the network (the GIL released): walk the destination meanwhile.
        with ThreadPoolExecutor(1, thread_name_prefix="s3sync-list") as lister:
            listed = lister.submit(self.conn.list_objects, self.src)
            try:
                local = (
                    _walk_local(
                        self.dest,
                        follow_inside_links=False,
                        refused=None,
                        clean_temps=not o.dry_run,
                    )
                    if self.dest.is_dir()
                    else {}
                )
                state = StateCache(self.dest, self.src.uri)
            finally:
                listing = listed.result()
        objs = [ob for ob in listing if ob.rel and o.selects(ob.rel)]
        report.files = len(objs)
        report.bytes_total = sum(ob.size for ob in objs)
        report.digest = listing_digest((ob.rel, ob.size, ob.etag) for ob in objs)

        dest_real = os.path.realpath(self.dest)
        wanted: dict[str, RemoteObject] = {}
        dirs: set[str] = set()
        todo: list[tuple[RemoteObject, str]] = []
        for ob in objs:
            rel = safe_relative_path(ob.rel)
            if rel is None or (rel in wanted and not ob.rel.endswith("/")):
                log.warning(
                    "s3-sync: refusing key %r (it would land outside %s)", ob.key, self.dest
                )
                report.refused.append(ob.key)
                continue
            if ob.rel.endswith("/"):  # folder marker: a folder, never a file
                dirs.add(rel)
                continue
            wanted[rel] = ob
        # Clashes between a file and a folder of the same name ("a" and "a/b"): refuse the file.
        parents = {p for rel in wanted for p in _parents(rel)} | dirs
        for rel in sorted(set(wanted) & parents):
            ob = wanted.pop(rel)
            log.warning("s3-sync: refusing key %r (a folder of that name is needed)", ob.key)
            report.refused.append(ob.key)
        for rel, ob in wanted.items():
            if not _inside(dest_real, self.dest, rel):
                log.warning("s3-sync: refusing key %r (path goes through a symlink)", ob.key)
                report.refused.append(ob.key)
                continue
            lf = local.get(rel)
            if lf is not None and self._unchanged(lf, ob, state):
                report.skipped += 1
                continue
            todo.append((ob, rel))

        keep = set(wanted)
        to_delete = []
        if o.delete:
            to_delete = [rel for rel in local if rel not in wanted and o.selects(rel)]
        if o.dry_run:
            report.transferred = len(todo)
            report.bytes_transferred = sum(ob.size for ob, _ in todo)
            report.deleted = len(to_delete)
            return report

        self.dest.mkdir(parents=True, exist_ok=True)
        for d in sorted(dirs):
            if _inside(dest_real, self.dest, d):
                try:
                    (self.dest / d).mkdir(parents=True, exist_ok=True)
                except OSError as exc:  # a file stands where the folder marker wants a folder
                    log.warning("s3-sync: cannot create folder %s: %s", self.dest / d, exc)
        if todo:
            self._transfer(todo, state)
        for rel in to_delete:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dest / rel)
                report.deleted += 1
                state.entries.pop(rel, None)
        if to_delete:  # folders emptied by the deletions go too (not those the source has)
            needed = parents | {p for d in dirs for p in (*_parents(d), d)}
            emptied = {p for rel in to_delete for p in _parents(rel)} - needed
            for folder in sorted(emptied, key=lambda p: p.count("/"), reverse=True):
                with contextlib.suppress(OSError):  # not empty (e.g. unselected files): kept
                    os.rmdir(self.dest / folder)
        state.save(keep=keep)
        return report

    def _unchanged(self, lf: _LocalFile, ob: RemoteObject, state: StateCache) -> bool:
        if not stat.S_ISREG(lf.st.st_mode) or lf.st.st_size != ob.size:
            return False
        cached = state.get(lf.rel, lf.st)
        if cached is not None and cached[3] == ob.etag:
            return True
        # No (or stale) record: compare content hashes; costs a read, no request.
        match = _ETAG_RE.match(ob.etag)
        if not match:
            return False
        if match.group(2) is None:
            etag = content_etag(lf.path, part_size=None)
        else:
            cands = multipart_candidates(ob.size, int(match.group(2)))
            etag = next(
                (
                    e
                    for e in (multipart_etag_parallel(lf.path, ob.size, ps) for ps in cands)
                    if e == ob.etag
                ),
                "",
            )
        if etag == ob.etag:
            state.put(lf.rel, lf.st, etag if "-" not in etag else None, ob.etag)
            return True
        return False

    def _transfer(self, todo: list[tuple[RemoteObject, str]], state: StateCache) -> None:
        """Fetch ``todo``: this thread issues requests (at most ``window`` in flight); one
        writer thread verifies each result, writes it under a temp name and commits batches."""
        o, report = self.o, self.report
        engine = make_engine(self.conn, engine=o.engine, max_concurrency=o.max_concurrency)
        report.engine = engine.name
        bar = Progress(
            total_files=len(todo), total_bytes=sum(ob.size for ob, _ in todo), mode=o.progress
        )
        errors: list[S3SyncError] = []
        window = max(64, o.max_concurrency * 8)
        dest = str(self.dest)
        # Results travel in bulk: transfer threads append to `ready` and wake the writer once
        # per WAKE_BATCH results (it also polls every few ms); the writer handles all that is
        # ready, then wakes the issuing thread once. Thousands of small files thus cost a few
        # hundred thread wake-ups instead of several per file.
        ready: deque = deque()
        wake = threading.Event()
        room = threading.Condition()
        counts = {"issued": 0, "handled": 0, "issuing": True}
        # Group commit: verified small files wait in a batch; one syncfs() makes the whole batch
        # durable, then they are renamed to their final names. A final name never points at
        # data that is not on disk, at one flush per batch instead of one fsync per file. A big
        # file gets its own fsync instead (syncfs would also flush whatever else is dirty).
        Item = tuple[RemoteObject, str, str, str | None, os.stat_result | None, bool]
        batch: list[Item] = []

        def commit(items: list[Item]) -> None:
            unsynced = [tmp for _, _, tmp, _, _, synced in items if not synced]
            if unsynced and not _syncfs(self.dest):  # no syncfs(2) here: one fsync per file
                for tmp in unsynced:
                    _fsync_file(tmp)
            for ob, rel, tmp, md5, st, _ in items:
                final = os.path.join(dest, rel)
                os.replace(tmp, final)  # keeps the mtime: a stat from before is still right
                state.put(rel, st or os.stat(final), md5, ob.etag)
                report.transferred += 1
                report.bytes_transferred += ob.size
                bar.file_done()

        def finish(ob: RemoteObject, rel: str, tmp: str, data: bytes | None, error) -> None:
            try:
                if error is not None:
                    raise error
                st = None
                big = ob.size >= PART_SIZE
                if isinstance(data, StreamedFile):  # written and hashed as it arrived
                    md5 = self._verify_streamed(ob, data)
                    if big:
                        _fsync_file(tmp)
                elif data is not None:  # a small object, in memory: verify, then write it
                    md5 = self._verify_bytes(ob, data)
                    st = _write_new(tmp, data)
                    if md5 is None:  # not an MD5 ETag: check the file the usual way
                        md5 = self._check_etag(ob, Path(tmp))
                else:  # written by the engine: hash it (big files: fsync alongside)
                    md5 = self._verify(ob, Path(tmp), fsync=big)
                if big:
                    commit([(ob, rel, tmp, md5, st, True)])
                    return
                batch.append((ob, rel, tmp, md5, st, False))
                if len(batch) >= COMMIT_BATCH:
                    commit(batch)
                    batch.clear()
            except BaseException as exc:  # noqa: BLE001 - collected and reported below
                head, name = os.path.split(tmp)
                for leftover in Path(head).glob(f"{glob_escape(name)}*"):
                    with contextlib.suppress(OSError):
                        leftover.unlink()
                errors.append(self.conn.translate(exc, bucket=self.src.bucket, key=ob.key))

        def arrived(item) -> None:  # on a transfer thread
            ready.append(item)
            if len(ready) >= _WAKE_BATCH:
                wake.set()

        def write_loop() -> None:
            try:
                # every issued request calls back exactly once (with its data or its error)
                while counts["issuing"] or counts["handled"] < counts["issued"]:
                    wake.wait(_POLL_SECONDS)
                    wake.clear()
                    handled = 0
                    while ready:
                        try:
                            finish(*ready.popleft())
                        finally:
                            handled += 1
                        if handled == _WAKE_BATCH or not ready:  # let the issuer refill
                            with room:
                                counts["handled"] += handled
                                room.notify()
                            handled = 0
            finally:
                try:
                    commit(batch)  # verified files are kept even when the sync stops early
                except OSError as exc:
                    errors.append(
                        S3SyncError(f"could not move verified downloads into {dest}: {exc}")
                    )

        writer = threading.Thread(target=write_loop, name="s3sync-writer", daemon=True)
        writer.start()
        made_dirs: set[str] = set()
        cancelled = True
        # One random tag per sync keeps its temp names apart from another sync's in the same
        # folder; within this sync the (shortened, digest-suffixed) final name is unique.
        tag = secrets.token_hex(4)
        try:
            for ob, rel in todo:
                head, name = os.path.split(rel)
                parent = os.path.join(dest, head) if head else dest
                if parent not in made_dirs:
                    os.makedirs(parent, exist_ok=True)
                    made_dirs.add(parent)
                tmp = os.path.join(parent, f".{_short(name)}.s3sync-{tag}.tmp")
                if counts["issued"] - counts["handled"] >= window:
                    with room:  # wait until a quarter of the window is free again
                        while counts["issued"] - counts["handled"] > window - window // 4:
                            room.wait()
                if errors:
                    break
                engine.download(
                    self.src.bucket,
                    ob.key,
                    ob.size,
                    ob.etag,
                    tmp,
                    bar.add_bytes,
                    lambda data, error, item=(ob, rel, tmp): arrived((*item, data, error)),
                )
                counts["issued"] += 1
            cancelled = bool(errors)
        finally:
            engine.shutdown(cancel=cancelled)
            counts["issuing"] = False
            wake.set()
            writer.join()  # every issued request has called back and been handled
            bar.close()
            for d in made_dirs:
                _fsync_dir(Path(d))
            state.save()
        if errors:
            raise S3SyncError(
                f"{len(errors)} of {len(todo)} download(s) from {self.src.uri} failed; first: "
                f"{errors[0]}"
            )

    def _check_size(self, ob: RemoteObject, size: int) -> None:
        if size != ob.size:
            raise S3SyncError(
                f"s3://{self.src.bucket}/{ob.key}: got {size} bytes, the listing says {ob.size}; "
                "the object changed during the sync or the transfer was cut - re-run"
            )

    def _verify_bytes(self, ob: RemoteObject, data: bytes) -> str | None:
        """Check size and (single-part) ETag of a downloaded object's bytes; returns the MD5, or
        None when the ETag is not an MD5 (then the caller checks the written file)."""
        self._check_size(ob, len(data))
        match = _ETAG_RE.match(ob.etag)
        if not match or match.group(2) is not None:
            return None
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if md5 != ob.etag:
            raise S3SyncError(
                f"s3://{self.src.bucket}/{ob.key}: MD5 {md5} != ETag {ob.etag}; "
                "the download is corrupt or the object changed - re-run"
            )
        return md5

    def _verify_streamed(self, ob: RemoteObject, got: StreamedFile) -> str | None:
        """Check a download hashed on the way; hash the file where that was not possible."""
        self._check_size(ob, os.path.getsize(got.path))
        if got.etag is None or not _ETAG_RE.match(ob.etag):
            return self._check_etag(ob, Path(got.path))
        if got.etag != ob.etag and "-" in ob.etag:
            # hashed with the likeliest part size; ask S3 for the real one and hash again
            return self._check_etag(ob, Path(got.path))
        if got.etag != ob.etag:
            raise S3SyncError(
                f"s3://{self.src.bucket}/{ob.key}: the downloaded bytes have ETag {got.etag}, the "
                f"object {ob.etag}; the download is corrupt or the object changed - re-run"
            )
        return got.md5

    def _verify(self, ob: RemoteObject, tmp: Path, *, fsync: bool = True) -> str | None:
        """Check size and ETag of the downloaded temp file (and fsync it); returns its MD5."""
        size = os.path.getsize(tmp)
        self._check_size(ob, size)
        if size < PART_SIZE or not fsync:
            if fsync:
                _fsync_file(tmp)
            return self._check_etag(ob, tmp)
        with ThreadPoolExecutor(1) as syncer:  # big file: flush to disk while we hash
            flushed = syncer.submit(_fsync_file, tmp)
            try:
                return self._check_etag(ob, tmp)
            finally:
                flushed.result()

    def _check_etag(self, ob: RemoteObject, tmp: Path) -> str | None:
        match = _ETAG_RE.match(ob.etag)
        if not match:
            return None  # e.g. SSE-KMS: the ETag is not an MD5; checksums were checked
        if match.group(2) is None:
            md5 = content_etag(tmp, part_size=None)
            if md5 != ob.etag:
                raise S3SyncError(
                    f"s3://{self.src.bucket}/{ob.key}: MD5 {md5} != ETag {ob.etag}; "
                    "the download is corrupt or the object changed - re-run"
                )
            return md5
        parts = int(match.group(2))
        hint = self.conn.first_part_size(self.src.bucket, ob.key)
        for ps in multipart_candidates(ob.size, parts, hint):
            if multipart_etag_parallel(tmp, ob.size, ps) == ob.etag:
                return None
        if hint is not None:
            raise S3SyncError(
                f"s3://{self.src.bucket}/{ob.key}: multipart ETag {ob.etag} does not match the "
                f"downloaded bytes (part size {hint}); the download is corrupt - re-run"
            )
        log.warning(
            "s3-sync: s3://%s/%s: part size of multipart ETag %s unknown; checked size only",
            self.src.bucket,
            ob.key,
            ob.etag,
        )
        return None


def _write_new(path: str, data: bytes) -> os.stat_result:
    """Create ``path`` (it must not exist) holding ``data``; returns its stat. Made durable by
    the batch commit."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return os.fstat(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


COMMIT_BATCH = 256
"""Verified small downloads made durable together (one syncfs) before their renames."""
_WAKE_BATCH = 32
"""Finished downloads that wake the writer thread (else it looks every _POLL_SECONDS)."""
_POLL_SECONDS = 0.005


def _syncfs(folder: Path) -> bool:
    """Flush the file system holding ``folder`` (Linux syncfs(2)); False where unavailable."""
    import ctypes

    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        return syncfs(fd) == 0
    finally:
        os.close(fd)


def multipart_etag_parallel(path: str | os.PathLike, size: int, part_size: int) -> str:
    """``md5-of-part-md5s-N`` of a file, hashing its parts on several threads."""
    count = max(1, -(-size // part_size))
    fd = os.open(path, os.O_RDONLY)
    try:

        def part_md5(index: int) -> bytes:
            h = hashlib.md5(usedforsecurity=False)
            offset, end = index * part_size, min(size, (index + 1) * part_size)
            while offset < end:
                chunk = os.pread(fd, min(_HASH_CHUNK, end - offset), offset)
                if not chunk:
                    break
                h.update(chunk)
                offset += len(chunk)
            return h.digest()

        workers = min(count, max(2, os.cpu_count() or 2))
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(part_md5, range(count)))
    finally:
        os.close(fd)
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{count}"


def _short(name: str, limit: int = 160) -> str:
    """``name`` cut to at most ``limit`` UTF-8 bytes (temp names must fit in 255 bytes); a cut
    name ends with a digest of the whole name, so two long names never share a temp name."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= limit:
        return name
    digest = hashlib.blake2s(raw, digest_size=4).hexdigest()
    return raw[: limit - 9].decode("utf-8", "ignore") + "~" + digest


def _wait(fut) -> None:
    """Block until ``fut`` is done (its error, if any, is read later by ``result()``)."""
    with contextlib.suppress(Exception):
        fut.result()


def _parents(rel: str) -> Iterable[str]:
    parts = rel.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def _inside(dest_real: str, dest: Path, rel: str) -> bool:
    """True if dest/rel (after resolving any symlinks on the way) stays inside dest."""
    parent = os.path.dirname(rel)
    if not parent:
        return True
    resolved = os.path.realpath(os.path.join(dest, parent))
    return resolved == dest_real or resolved.startswith(dest_real + os.sep)


# -- upload --------------------------------------------------------------------------------
class _Upload:
    def __init__(self, options: SyncOptions, conn: S3Connection, src: Path, dst: S3Location):
        self.o = options
        self.conn = conn
        self.src = src
        self.dst = dst
        self.report = SyncReport(
            dry_run=options.dry_run, source=options.source, destination=options.destination
        )

    def run(self) -> SyncReport:
        o, report = self.o, self.report
        if not self.src.is_dir():
            raise S3SyncError(
                f"source folder {str(self.src)!r} does not exist or is not a folder; "
                "pass an existing local folder or an s3:// URI"
            )
        refused: list[str] = []
        local = _walk_local(self.src, follow_inside_links=True, refused=refused)
        report.refused = [r for r in refused if o.selects(r)]
        files = {rel: lf for rel, lf in local.items() if o.selects(rel)}
        remote = {ob.rel: ob for ob in self.conn.list_objects(self.dst)}
        state = StateCache(self.src, self.dst.uri)
        # Content id of a file = the ETag our upload gives it: MD5 below PART_SIZE, else
        # md5-of-part-md5s-N for PART_SIZE parts (hashed on several threads).
        todo: list[tuple[_LocalFile, str]] = []  # (file, content id)
        digest_entries = []
        for rel, lf in files.items():
            size = lf.st.st_size
            cached = state.get(rel, lf.st)
            cid: str = cached[2] if cached and cached[2] else local_content_id(lf.path, size)
            digest_entries.append((rel, size, cid))
            ob = remote.get(rel)
            known = ob is not None and cached is not None and cached[3] == ob.etag
            if ob is not None and ob.size == size and (known or self._same(lf, ob, cid)):
                if not known:
                    state.put(rel, lf.st, cid, ob.etag)
                report.skipped += 1
                continue
            todo.append((lf, cid))
        report.files = len(files)
        report.bytes_total = sum(lf.st.st_size for lf in files.values())
        report.digest = listing_digest(digest_entries)
        to_delete = []
        if o.delete:
            to_delete = [
                ob.key for rel, ob in remote.items() if rel not in files and o.selects(rel)
            ]
        if o.dry_run:
            report.transferred = len(todo)
            report.bytes_transferred = sum(lf.st.st_size for lf, _ in todo)
            report.deleted = len(to_delete)
            return report
        try:
            if todo:
                self._transfer(todo, state)
            if to_delete:
                self.conn.delete_keys(self.dst.bucket, to_delete)
                report.deleted = len(to_delete)
        finally:
            state.save(keep=set(files))
        return report

    def _same(self, lf: _LocalFile, ob: RemoteObject, cid: str) -> bool:
        """Does the remote object (same size) hold this file's bytes? Hashes, no request."""
        if ob.etag == cid:
            return True
        match = _ETAG_RE.match(ob.etag)
        if not match:
            return False
        size = lf.st.st_size
        if match.group(2) is None:  # remote is single-part: compare whole-file MD5s
            return size >= PART_SIZE and content_etag(lf.path, part_size=None) == ob.etag
        cands = [ps for ps in multipart_candidates(size, int(match.group(2))) if ps != PART_SIZE]
        return any(multipart_etag_parallel(lf.path, size, ps) == ob.etag for ps in cands)

    def _transfer(self, todo: list[tuple[_LocalFile, str]], state: StateCache) -> None:
        o, report = self.o, self.report
        engine = make_engine(self.conn, engine=o.engine, max_concurrency=o.max_concurrency)
        report.engine = engine.name
        bar = Progress(
            total_files=len(todo),
            total_bytes=sum(lf.st.st_size for lf, _ in todo),
            mode=o.progress,
        )
        errors: list[S3SyncError] = []
        pending: deque[tuple[Future, _LocalFile, str]] = deque()
        window = max(64, o.max_concurrency * 8)

        def finish(item) -> None:
            fut, lf, cid = item
            key = self.dst.prefix + lf.rel
            try:
                fut.result()
            except BaseException as exc:  # noqa: BLE001 - collected and reported below
                errors.append(self.conn.translate(exc, bucket=self.dst.bucket, key=key))
                return
            size = lf.st.st_size
            state.put(lf.rel, lf.st, cid, cid)  # our upload gives the object ETag == cid
            report.transferred += 1
            report.bytes_transferred += size
            bar.file_done()

        cancelled = True
        try:
            for lf, cid in todo:
                key = self.dst.prefix + lf.rel
                # below PART_SIZE cid is the MD5: sent as Content-MD5, checked by the server
                fut = engine.upload(
                    lf.path, self.dst.bucket, key, lf.st.st_size, cid, bar.add_bytes
                )
                pending.append((fut, lf, cid))
                while len(pending) > window:
                    finish(pending.popleft())
            while pending:
                finish(pending.popleft())
            cancelled = False
        finally:
            engine.shutdown(cancel=cancelled)
            bar.close()
        if errors:
            raise S3SyncError(
                f"{len(errors)} of {len(todo)} upload(s) to {self.dst.uri} failed; first: "
                f"{errors[0]}"
            )
