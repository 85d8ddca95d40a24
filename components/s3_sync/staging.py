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
init container or command prefix). Frozen folders are never deleted here (a job may read one).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

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
    from components.s3_sync.api import sync

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
    return Staged(source=source, snapshot=snapshot, report=report)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
