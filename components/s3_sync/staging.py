"""Stage a data set from S3 on local disk: a mirror of its own source, frozen by digest.

``stage(source, root)``:

1. ``<root>/<source key>/mirror`` is the incremental sync target of ``source`` (the key is a
   digest of the ``s3://bucket/prefix``): different sources never share a folder, and a typo lands
   in a new, empty folder instead of deleting anything. Stagings of the same source take turns (a
   lock file), so two jobs on one node (a hostPath cache) do not sync into each other.
2. An optional ``check(mirror)`` refuses what is no usable data set (the pipeline checks the
   ImageFolder layout).
3. The mirror is frozen as ``<root>/<source key>/<digest>/`` with hard links (no bytes copied).
   The sync never writes into an existing file (it renames new ones into place), so a frozen
   folder stays exactly what was synced while a later staging refreshes the mirror.

The pipeline stages into its workspace volume (``pipelines.dataset``); a training node stages into
its own disk before the trainer starts (``python -m components.s3_sync.stage``, the launcher's
init container or command prefix).

A cache kept between pods (an admin's hostPath) is bounded by ``evict``: per source the ``keep``
most recently used frozen folders stay, and a source unused for ``max_idle_days`` goes entirely
(its mirror too). A frozen folder in use is never evicted: whoever reads one holds a shared lock
on ``<digest>.in-use`` beside it (``hold``; the stager keeps it across ``exec`` into the trainer),
and eviction takes the lock exclusively without waiting, skipping what it cannot take. Its
modification time is the folder's last use. ``stage`` itself deletes nothing it froze.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from components.s3_sync.api import sync
from components.s3_sync.errors import S3SyncUsageError
from components.s3_sync.options import SyncReport


class DataChanged(S3SyncUsageError):
    """The data set's listing is not the one expected (permanent: a retry stages it again)."""


@dataclass(frozen=True)
class Staged:
    """Where a staged data set is and what its sync did."""

    source: str
    snapshot: Path
    """The frozen folder of this digest."""
    report: SyncReport

    @property
    def digest(self) -> str:
        return self.report.digest


def source_key(source: str) -> str:
    """The folder name of a source: a digest of its ``s3://bucket/prefix``.

    The endpoint is left out on purpose: the same bucket reached through another URL (a
    port-forward, a new service address) is the same data, and keeps its synced mirror.
    """
    return hashlib.sha256(f"{source.rstrip('/')}/".encode()).hexdigest()[:16]


def snapshot_path(root: str | os.PathLike, source: str, digest: str) -> Path:
    """The frozen folder of ``source``'s listing ``digest`` under ``root``."""
    return Path(root) / source_key(source) / digest[:16]


def stage(
    source: str,
    root: str | os.PathLike,
    *,
    endpoint_url: str | None = None,
    check: Callable[[Path], object] | None = None,
    expect_digest: str | None = None,
) -> Staged:
    """Sync ``source`` into ``root``, check it, freeze it (see the module doc).

    ``expect_digest``: the listing digest the pipeline saw; another one means the data changed
    in S3 since (or between the nodes' stagings), and training on it would not be the data that
    was checked, cached and evaluated: ``DataChanged`` is raised and nothing is frozen.
    """
    folder = Path(root) / source_key(source)
    mirror = folder / "mirror"
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        # Deleting inside our own mirror loses nothing: frozen snapshots keep every file alive.
        report = sync(
            source,
            mirror,
            endpoint_url=endpoint_url,
            delete=True,
            max_delete="100%",
            progress=False,
        )
        if expect_digest and report.digest != expect_digest:
            raise DataChanged(
                f"{source} changed since the pipeline listed it (digest {expect_digest[:16]}, "
                f"now {report.digest[:16]}): run the pipeline again, and do not write into a "
                "data set while a run trains on it (write a new prefix instead)"
            )
        if check is not None:
            check(mirror)
        snapshot = freeze(mirror, snapshot_path(root, source, report.digest))
        _use_file(snapshot).touch()  # its last use, before another stager may evict
    return Staged(source=source, snapshot=snapshot, report=report)


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """An exclusive lock on ``path``; with ``wait=False`` yields False instead of waiting."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _use_file(snapshot: Path) -> Path:
    return snapshot.with_name(f"{snapshot.name}.in-use")


def hold(snapshot: Path) -> int:
    """Mark ``snapshot`` in use (and used now) until the returned descriptor is closed.

    The descriptor is inheritable, so a process that ``exec``s keeps the mark for the new
    program's lifetime; it goes with the last process holding it, however that ends.
    """
    fd = os.open(_use_file(snapshot), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.utime(fd)
    os.set_inheritable(fd, True)
    return fd


@dataclass
class Eviction:
    """What ``evict`` removed and what it kept because it was in use."""

    removed: list[Path] = field(default_factory=list)
    in_use: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        return f"evicted {len(self.removed)} cached data set(s), {len(self.in_use)} in use kept"


def evict(
    root: str | os.PathLike, *, keep: int, max_idle_days: float, now: float | None = None
) -> Eviction:
    """Bound the cache under ``root`` (see the module doc); a source being staged is skipped."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (the data set just staged), not {keep}")
    now = time.time() if now is None else now
    done = Eviction()
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        lock = folder / ".lock"
        if not lock.exists():
            continue  # not a staged source: nothing of ours
        with _locked(lock, wait=False) as mine:
            if mine:
                _evict_source(folder, keep, now - max_idle_days * 86400, done)
    return done


def _evict_source(folder: Path, keep: int, idle_before: float, done: Eviction) -> None:
    # A freeze or an eviction that never finished (a killed pod): nobody else is at it now.
    for stale in [*folder.glob(".*.building-*"), *folder.glob(".*.evicting-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    snapshots = sorted(
        (p for p in folder.iterdir() if p.is_dir() and p.name != "mirror" and p.name[0] != "."),
        key=_last_use,
        reverse=True,
    )
    idle = not snapshots or _last_use(snapshots[0]) < idle_before
    for snapshot in snapshots if idle else snapshots[keep:]:
        if _remove_unused(snapshot):
            done.removed.append(snapshot)
        else:
            done.in_use.append(snapshot)
    if idle and not any(p in done.in_use for p in snapshots):
        shutil.rmtree(folder / "mirror", ignore_errors=True)
        done.removed.append(folder / "mirror")


def _last_use(snapshot: Path) -> float:
    use = _use_file(snapshot)
    return use.stat().st_mtime if use.exists() else snapshot.stat().st_mtime


def _remove_unused(snapshot: Path) -> bool:
    """Remove ``snapshot`` unless someone holds it; its files leave the name space first."""
    use = _use_file(snapshot)
    with _locked(use, wait=False) as free:
        if not free:
            return False
        gone = snapshot.with_name(f".{snapshot.name}.evicting-{os.getpid()}")
        os.replace(snapshot, gone)
        use.unlink()
    shutil.rmtree(gone, ignore_errors=True)
    return True


def freeze(mirror: Path, snapshot: Path) -> Path:
    """``snapshot`` as hard links of ``mirror``'s files (made once; atomically by a rename)."""
    if snapshot.is_dir():
        return snapshot
    building = snapshot.with_name(f".{snapshot.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    for path in sorted(mirror.rglob("*")):
        target = building / path.relative_to(mirror)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file() and not path.name.startswith("."):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:  # a file system without hard links: copy
                shutil.copy2(path, target)
    os.replace(building, snapshot)
    return snapshot


def point(link: Path, target: Path) -> None:
    """Make ``link`` a symlink to ``target``, replacing an older one atomically."""
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    temporary.symlink_to(target)
    os.replace(temporary, link)
