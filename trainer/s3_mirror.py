"""The S3 mirror: rank 0 uploads each complete local checkpoint in the background.

The checkpointer's writer thread hands each complete ``step-N/`` to :meth:`CheckpointMirror.offer`,
which never blocks: it hard-links the folder's two files into ``.mirror/pending`` (so pruning the
local folder cannot pull the files from under an upload) and wakes the uploader thread. That
thread sends the checkpoint (``state.pt`` first, the marker last; see
:mod:`trainer.remote_checkpoints`), then prunes S3 to the newest ``--keep-checkpoints`` complete
folders: older ones go only after a newer one is complete there.

One upload runs and at most one waits. When uploads fall behind (a checkpoint interval shorter
than an upload), a newer checkpoint takes the waiting one's place and the older one is skipped,
with a log line: training never waits for S3 mid-run.

Failures (the rule, also in the README):

- mid-run: a failed upload is logged; S3 keeps its previous complete checkpoints, and the next
  checkpoint is uploaded as usual;
- the last checkpoint (end of the run, SIGTERM, a finished run started again):
  :meth:`CheckpointMirror.wait_durable` waits up to ``--checkpoint-upload-timeout-s`` for it to be
  complete in S3, retrying uploads that failed for want of an answer (timeouts, connection
  errors, 5xx); a refusal (4xx: access denied, no such bucket) is final at once. At the end of
  the run a checkpoint that could not be made durable fails the run (exit 4); after a SIGTERM
  the run exits 143 anyway, with a warning: the pod is going away and a restart resumes from the
  newest checkpoint that is durable.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainer import checkpoint as ckpt
from trainer.remote_checkpoints import RemoteCheckpoints, is_transient
from trainer.run_log import RunLog

RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0)
"""Pauses between retries of the last checkpoint's upload (the last one repeats)."""


@dataclass(kw_only=True)
class _Upload:
    """One checkpoint handed to the uploader thread."""

    step: int
    folder: Path
    """What is uploaded: a staging folder of hard links, or the step folder itself."""
    saved_at: float
    """``time.monotonic()`` when the checkpoint was saved (for the durable-after figure)."""


@dataclass(frozen=True, kw_only=True)
class Mirrored:
    """A checkpoint that became complete in S3."""

    step: int
    durable_s: float
    """Seconds from the checkpoint's save to its marker in S3."""
    upload_s: float
    """Seconds the upload itself took."""


class CheckpointMirror:
    """Uploads rank 0's complete checkpoints to ``remote`` on a thread of its own."""

    def __init__(self, remote: RemoteCheckpoints, *, keep: int, log: RunLog):
        self.remote, self.keep, self.log = remote, keep, log
        self.mirrored: list[Mirrored] = []
        """Every checkpoint made durable, in order."""
        self.skipped: list[int] = []
        """Steps replaced by a newer checkpoint before their upload began."""
        self._errors: dict[int, Exception] = {}
        self._lock = threading.Condition()
        self._pending: _Upload | None = None
        self._busy: _Upload | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="checkpoint-mirror", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------ training side
    def offer(self, step: int, folder: Path, saved_at: float | None = None) -> None:
        """Queue a complete local checkpoint for upload (replacing one still waiting). Never
        raises and never waits for an upload: it runs on the checkpoint writer's thread."""
        saved_at = time.monotonic() if saved_at is None else saved_at
        try:
            with self._lock:
                replaced = self._pending
                staged = _stage(Path(folder), self.remote.scratch / "pending")
                self._pending = _Upload(step=step, folder=staged, saved_at=saved_at)
                self._lock.notify_all()
        except Exception as err:  # noqa: BLE001 - a failed hand-over must not fail the write
            self.log.line(f"WARNING: step-{step} could not be queued for upload to S3: {err}")
            return
        if replaced is not None and replaced.step != step:
            self.skipped.append(replaced.step)
            busy = self._busy
            self.log.line(
                f"WARNING: checkpoint uploads to {self.remote.uri} are behind: step-"
                f"{replaced.step} is skipped (step-{busy.step if busy else '?'} is still "
                f"uploading), step-{step} is queued in its place; a longer "
                "--checkpoint-every-steps would mirror every checkpoint"
            )

    def catch_up(self) -> None:
        """Upload the newest local checkpoint if S3 lacks it (a run that resumed from a local
        checkpoint newer than any in S3, or a finished run started again with the flag)."""
        newest = ckpt.latest_complete_checkpoint(self.remote.local_root)
        if newest is None:
            return
        step = ckpt.step_of(newest)
        if step is not None and step not in self.remote.complete:
            self.log.line(f"{newest.name} is not in {self.remote.uri} yet: uploading it")
            self.offer(step, newest)

    def wait_durable(self, step: int, folder: Path, timeout_s: float) -> Exception | None:
        """Wait until ``step`` is complete in S3; None then, else why it is not.

        Uploads it if nothing has; retries failures to answer until ``timeout_s`` is spent; a
        refusal (permanent) returns at once.
        """
        deadline = time.monotonic() + timeout_s
        delays = iter(RETRY_DELAYS_S)
        delay = RETRY_DELAYS_S[0]
        while True:
            with self._lock:
                self._lock.wait_for(
                    lambda: not self._queued(step), timeout=max(0.0, deadline - time.monotonic())
                )
                if self._queued(step):
                    # A retry still under way at the deadline: its predecessor's error says
                    # more (a dead endpoint) than "did not finish".
                    return self._errors.get(step) or TimeoutError(
                        f"the upload of step-{step} to {self.remote.uri} did not finish within "
                        f"--checkpoint-upload-timeout-s {timeout_s:g}"
                    )
                if step in self.remote.complete:
                    return None
                error = self._errors.get(step)
            if error is not None:
                if not is_transient(error) or time.monotonic() + delay >= deadline:
                    return error
                self.log.line(f"retrying the upload of step-{step} in {delay:g}s")
                time.sleep(delay)
                delay = next(delays, delay)
            self.offer(step, folder)

    def close(self, timeout_s: float) -> None:
        """Drop a waiting upload; give the running one up to ``timeout_s`` to finish."""
        with self._lock:
            self._closing = True
            self._pending = None
            self._lock.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.log.line(
                f"WARNING: an upload to {self.remote.uri} was still running after {timeout_s:g}s; "
                "left unfinished (a folder without its marker never counts)"
            )

    # ------------------------------------------------------------------------ uploader side
    def _queued(self, step: int) -> bool:
        return any(job is not None and job.step == step for job in (self._pending, self._busy))

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending is not None or self._closing)
                if self._pending is None:
                    return
                job, self._pending = self._pending, None
                job.folder = _take(job.folder, self.remote.scratch / "uploading")
                self._busy = job
            try:
                self._upload(job)
            finally:
                if job.folder.parent == self.remote.scratch:  # the links would hold the space
                    shutil.rmtree(job.folder, ignore_errors=True)
                with self._lock:
                    self._busy = None
                    self._lock.notify_all()

    def _upload(self, job: _Upload) -> None:
        began = time.monotonic()
        try:
            self.remote.upload(job.step, job.folder)
        except Exception as err:  # noqa: BLE001 - S3SyncError, OSError: logged, never fatal here
            self._errors[job.step] = err
            newest = max(self.remote.complete, default=None)
            holds = f"step-{newest}" if newest is not None else "no complete checkpoint"
            self.log.line(
                f"WARNING: the upload of step-{job.step} to {self.remote.uri} failed: {err}. "
                f"S3 still holds {holds}; the next checkpoint is uploaded as usual"
            )
            return
        done = time.monotonic()
        self._errors.pop(job.step, None)
        self.mirrored.append(
            Mirrored(step=job.step, durable_s=done - job.saved_at, upload_s=done - began)
        )
        self.log.line(
            f"checkpoint step-{job.step} is durable in {self.remote.folder_uri(job.step)} "
            f"({done - job.saved_at:.2f}s after its save; upload {done - began:.2f}s)"
        )
        try:
            self.remote.prune(self.keep)
        except Exception as err:  # noqa: BLE001 - the new checkpoint is safe; retried next time
            self.log.line(f"WARNING: pruning old checkpoints in {self.remote.uri} failed: {err}")


def _stage(folder: Path, slot: Path) -> Path:
    """Hard links to ``folder``'s checkpoint files in ``slot``: what the upload will read.

    Where the file system has no hard links, the folder itself (a local prune during its upload
    then fails that one upload, and the next checkpoint is uploaded as usual).
    """
    shutil.rmtree(slot, ignore_errors=True)
    slot.mkdir(parents=True)
    try:
        for name in (ckpt.STATE_FILE, ckpt.MARKER_FILE):
            os.link(folder / name, slot / name)
    except OSError:
        shutil.rmtree(slot, ignore_errors=True)
        return folder
    return slot


def _take(staged: Path, slot: Path) -> Path:
    """Move a staged upload out of the pending slot (which the next offer refills)."""
    if staged.parent != slot.parent:
        return staged  # not staged: the step folder itself
    shutil.rmtree(slot, ignore_errors=True)
    os.rename(staged, slot)
    return slot
