"""The S3 copy of the checkpoint folder: the same ``step-N/`` folders under ``--checkpoint-uri``.

Imported only when ``--checkpoint-uri`` is set: it brings the S3 sync (:mod:`components.s3_sync`,
and with it the AWS CRT/botocore). Every transfer is one ``sync`` call, so uploads carry checksums
the server checks, and downloads are verified and renamed into place only when complete.

A remote folder counts only once its ``COMPLETE`` marker exists, as a local one does:

- an upload sends ``state.pt`` first and the marker last (two syncs), so an upload killed at any
  point leaves a folder without marker, which is never resumed from and is removed by the next
  pruning;
- a deletion removes the markers first, then the rest;
- listing the complete checkpoints = syncing only the markers into ``.mirror/markers``.

Deleting is a sync of an empty folder with ``delete=True``, narrowed by filters to ``step-N/``
keys: nothing else under the prefix is ever deleted. Only rank 0 of one job writes here: the
prefix belongs to that job, like ``--checkpoint-dir``.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from components.s3_sync import S3SyncError, sync
from kfp_ddp.atomic_files import fsync_dir
from trainer import checkpoint as ckpt
from trainer.errors import ConfigError, StorageError
from trainer.run_log import RunLog

ALL = "100%"
"""``max_delete`` for the deletions here: they are deliberate (a local cache of the markers, old
checkpoints pruned), narrowed by filters to ``step-N/`` keys, not a guess about a source."""

SCRATCH = ".mirror"
"""The mirror's own folder in ``--checkpoint-dir`` (never a ``step-N`` name, so never counted)."""

_TRANSIENT_CRT_ERRORS = ("AWS_IO_SOCKET_", "AWS_IO_DNS_", "AWS_ERROR_HTTP_CONNECTION")
_TRANSIENT_BOTOCORE_ERRORS = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
}


def is_transient(err: BaseException) -> bool:
    """Whether S3 did not answer (connection refused or reset, DNS, timeouts) or answered 5xx/429.

    An answer that refuses (no such bucket, access denied, bad credentials: 4xx) or a setting
    that cannot work (a TLS failure, a malformed endpoint) is permanent: retrying cannot help.
    Decided from the exception chain the S3 sync raises ``from`` the CRT/botocore error; an error
    without one is taken as permanent, so that nothing is retried forever by mistake.
    """
    for cause in _chain(err):
        status = _http_status(cause)
        if status is not None:
            return status >= 500 or status == 429
        name = getattr(cause, "name", None)
        if isinstance(name, str) and name.startswith(_TRANSIENT_CRT_ERRORS):
            return True
        if type(cause).__name__ in _TRANSIENT_BOTOCORE_ERRORS:
            return True
    return False


def is_refusal(err: BaseException) -> bool:
    """Whether S3 answered ``err``'s request with an HTTP error status."""
    return any(_http_status(cause) is not None for cause in _chain(err))


def is_local(err: BaseException) -> bool:
    """Whether ``err`` comes from the local file system (e.g. a full disk), not the network."""
    network = (ConnectionError, TimeoutError, socket.gaierror)
    return any(
        isinstance(cause, OSError) and not isinstance(cause, network) for cause in _chain(err)
    )


def _chain(err: BaseException) -> Iterable[BaseException]:
    cause: BaseException | None = err
    while cause is not None:
        yield cause
        cause = cause.__cause__ or cause.__context__


def _http_status(err: BaseException) -> int | None:
    """The HTTP status of a CRT S3ResponseError or a botocore ClientError, if ``err`` is one."""
    status = getattr(err, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    return None


class RemoteCheckpoints:
    """``step-N/`` folders under ``uri``, and which of them are complete (as far as we know).

    ``complete`` is filled by :meth:`list_complete` and kept up to date by this object's own
    uploads and deletions (nothing else writes under the prefix). Methods raise S3SyncError.
    """

    def __init__(self, uri: str, local_root: Path, *, patience_s: float):
        self.uri = uri.rstrip("/")
        self.local_root = Path(local_root)
        self.scratch = self.local_root / SCRATCH
        self.patience_s = patience_s
        """How long a start retries S3 when it does not answer."""
        self.complete: set[int] = set()

    def folder_uri(self, step: int) -> str:
        return f"{self.uri}/step-{step}/"

    # ------------------------------------------------------------------------------ reading
    def list_complete(self) -> list[int]:
        """Steps whose folder has its marker, newest first (fetches the small markers)."""
        markers = self.scratch / "markers"
        markers.mkdir(parents=True, exist_ok=True)
        sync(
            self.uri,
            markers,
            filters=_only(f"step-*/{ckpt.MARKER_FILE}"),
            delete=True,
            max_delete=ALL,
        )
        self.complete = {
            step
            for step, folder in ckpt.step_dirs(markers)
            if (folder / ckpt.MARKER_FILE).is_file()
        }
        return sorted(self.complete, reverse=True)

    def download(self, step: int) -> Path:
        """Fetch ``step-N/`` into the local checkpoint folder, whole or not at all; its path.

        The files land in a scratch folder first (each verified by the sync) and the folder is
        renamed to ``step-N`` only when the marker is there too. A local ``step-N`` (a leftover
        without marker, or a corrupt copy) is replaced.
        """
        incoming = self.scratch / f"download-step-{step}"
        shutil.rmtree(incoming, ignore_errors=True)
        sync(self.folder_uri(step), incoming)
        if not (incoming / ckpt.MARKER_FILE).is_file():
            raise S3SyncError(
                f"{self.folder_uri(step)} lost its {ckpt.MARKER_FILE} marker while it was "
                "downloaded; is another job writing under --checkpoint-uri?"
            )
        folder = self.local_root / f"step-{step}"
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(incoming, folder)
        fsync_dir(self.local_root)
        return folder

    # ------------------------------------------------------------------------------ writing
    def upload(self, step: int, folder: Path) -> None:
        """Send a complete local checkpoint folder: ``state.pt`` first, the marker last."""
        if step in self.complete:  # written again (a rerun of that step): uncount it first
            self.drop_markers([step])
        target = self.folder_uri(step)
        state = sync(folder, target, exclude=[ckpt.MARKER_FILE])
        if state.refused or state.transferred + state.skipped < state.files or not state.files:
            raise S3SyncError(f"{folder} was not uploaded whole to {target}: {state.summary()}")
        sync(folder, target, filters=_only(ckpt.MARKER_FILE))
        self.complete.add(step)

    def drop_markers(self, steps: Iterable[int]) -> None:
        """Delete the markers of ``steps``: from now on those folders do not count."""
        patterns = [f"step-{step}/{ckpt.MARKER_FILE}" for step in steps]
        if patterns:
            sync(self._empty(), self.uri, filters=_only(*patterns), delete=True, max_delete=ALL)
            self.complete.difference_update(steps)

    def prune(self, keep: int) -> list[int]:
        """Keep the newest ``keep`` complete folders; delete the others and every folder without
        marker (killed uploads, corrupt checkpoints). Returns the complete steps deleted."""
        kept = sorted(self.complete, reverse=True)[:keep]
        dropped = sorted(self.complete - set(kept))
        self.drop_markers(dropped)  # they stop counting before their state goes
        filters = [*_only("step-[0-9]*/*"), *(("exclude", f"step-{step}/*") for step in kept)]
        sync(self._empty(), self.uri, filters=filters, delete=True, max_delete=ALL)
        return dropped

    def _empty(self) -> Path:
        empty = self.scratch / "empty"
        shutil.rmtree(empty, ignore_errors=True)
        empty.mkdir(parents=True)
        return empty


def _only(*patterns: str) -> list[tuple[str, str]]:
    """Sync filters that select only keys matching ``patterns`` (relative to the prefix)."""
    return [("exclude", "*"), *(("include", pattern) for pattern in patterns)]


# ------------------------------------------------------------------------------------ at start
_T = TypeVar("_T")
_START_RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 15.0)


def list_remote(remote: RemoteCheckpoints, log: RunLog) -> list[int]:
    """The complete remote steps, newest first; ConfigError if S3 cannot be listed."""
    steps = _at_start(remote, log, "list", remote.list_complete)
    newest = f"newest step-{steps[0]}" if steps else "none yet"
    log.line(f"{remote.uri}: {len(steps)} complete checkpoint(s), {newest}")
    return steps


def read_remote(remote: RemoteCheckpoints, step: int, log: RunLog) -> tuple[Path, bytes] | None:
    """Download ``step-N`` and read it like a local checkpoint: (folder, bytes), or None when it
    is corrupt (its bytes fail the sync's or the marker's check): then its local copy is set
    aside, its marker in S3 deleted, and the caller falls back to the next newest checkpoint.

    ConfigError when S3 refuses or does not answer; StorageError when the local disk fails.
    """
    log.line(f"downloading step-{step} from {remote.uri} (newer than any local checkpoint)")
    folder = _at_start(remote, log, f"download step-{step} from", lambda: remote.download(step))
    try:
        data = ckpt.read_checkpoint_bytes(folder)
    except ckpt.CheckpointError as err:
        ckpt.set_aside(folder, err)
        log.line(
            f"WARNING: {remote.folder_uri(step)} is unusable ({err}); deleting its marker there "
            "and falling back to the previous checkpoint"
        )
        try:
            remote.drop_markers([step])
        except S3SyncError as drop_err:
            log.line(f"WARNING: could not delete the marker of step-{step}: {drop_err}")
        remote.complete.discard(step)  # never kept by pruning: the next pruning removes it
        return None
    log.line(f"resuming from {remote.folder_uri(step)} (downloaded to {folder})")
    return folder, data


def _at_start(remote: RemoteCheckpoints, log: RunLog, what: str, call: Callable[[], _T]) -> _T:
    """``call()``, retried while S3 does not answer (up to ``remote.patience_s``).

    A start that cannot use S3 stops before training, with exit 2: a refusal (no such bucket,
    access denied, credentials rejected) at once, no answer after the patience is spent (most
    often a wrong endpoint or a network policy; a short outage is ridden out). Any other
    failure (bytes that failed the sync's verification in transit, ...) is tried once more.
    A local disk error is exit 4.
    """
    deadline = time.monotonic() + remote.patience_s
    delays = iter(_START_RETRY_DELAYS_S)
    tried_again = False
    while True:
        try:
            return call()
        except S3SyncError as err:
            delay = next(delays, _START_RETRY_DELAYS_S[-1])
            transient = is_transient(err)
            if not transient and is_local(err):
                raise StorageError(
                    f"could not {what} {remote.uri} into {remote.local_root}: {err}"
                ) from err
            if not transient and not is_refusal(err) and not tried_again:
                tried_again = True
                continue
            if transient and time.monotonic() + delay < deadline:
                log.line(f"WARNING: could not {what} {remote.uri} ({err}); retrying in {delay:g}s")
                time.sleep(delay)
                continue
            why = (
                f"S3 did not answer for {remote.patience_s:g}s (--checkpoint-upload-timeout-s)"
                if transient
                else "S3 refused"
            )
            raise ConfigError(
                f"--checkpoint-uri {remote.uri}: could not {what} it before training: {why}: {err}"
            ) from err
