"""Checkpoints that count: rank 0's write in flight settled on every rank, and with
``--checkpoint-uri`` the run's last checkpoint complete in S3 before the run ends.

Rank 0 writes checkpoints in the background (:class:`~trainer.checkpointer.Checkpointer`) and
mirrors them to S3 (:class:`~trainer.s3_mirror.CheckpointMirror`). Every rank learns how that
went at the same points (a small all-reduce each), so that all take the same branch: a rank that
stopped alone would leave the others hanging in their next collective.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainer.checkpointer import Checkpointer
from trainer.distributed import agree
from trainer.errors import StorageError
from trainer.run_log import RunLog

if TYPE_CHECKING:  # imported only with --checkpoint-uri
    from trainer.s3_mirror import CheckpointMirror


class CheckpointDurability:
    """Whether rank 0's checkpoints are written (and mirrored), agreed on by every rank."""

    def __init__(
        self,
        checkpointer: Checkpointer,
        *,
        checkpoint_dir: Path,
        checkpoint_uri: str | None,
        upload_timeout_s: float,
        group,
        log: RunLog,
    ):
        self.checkpointer, self.group, self.log = checkpointer, group, log
        self.checkpoint_dir, self.checkpoint_uri = checkpoint_dir, checkpoint_uri
        self.upload_timeout_s = upload_timeout_s

    def write_failure(self) -> StorageError:
        """The error to stop with after rank 0's write failed (its own, on rank 0)."""
        if self.checkpointer.failure is not None:
            return self.checkpointer.failure
        return StorageError(
            "rank 0 could not write a checkpoint (its log says why); stopping with it",
            on_another_rank=True,
        )

    def settle(self) -> None:
        """Wait for rank 0's write in flight; every rank learns whether it failed (a barrier)."""
        self.checkpointer.wait()
        if agree([self.checkpointer.failed()], self.group)[0]:
            raise self.write_failure()

    def step_folder(self, step: int) -> Path:
        return self.checkpoint_dir / f"step-{step}"

    def after_sigterm(self, step: int, mirror: CheckpointMirror | None) -> None:
        """The SIGTERM checkpoint complete before any rank exits, and in S3 if it can be within
        the grace period (a warning if not: a restart elsewhere resumes from an older one).

        With ``--checkpoint-uri`` every rank waits for rank 0's upload before it exits: where
        the first rank to exit ends the others (Ray Train tears its worker group down at once),
        rank 0's upload would end with them."""
        self.settle()
        error = None
        if mirror is not None:
            error = mirror.wait_durable(step, self.step_folder(step), self.upload_timeout_s)
        if error is not None:
            self.log.line(
                f"WARNING: the SIGTERM checkpoint step-{step} is only on this node's disk "
                f"({error}); a restart elsewhere resumes from the newest checkpoint in "
                f"{self.checkpoint_uri}"
            )
        if self.checkpoint_uri:
            agree([error is not None], self.group)  # rank 0's upload is over

    def make_durable(self, step: int, mirror: CheckpointMirror | None) -> None:
        """With --checkpoint-uri, the run's last checkpoint must be complete in S3 before it
        ends: rank 0 waits for it (up to --checkpoint-upload-timeout-s), every rank learns the
        outcome, and all stop with exit 4 if it could not be made durable."""
        if not self.checkpoint_uri:
            return
        error = None
        if mirror is not None:
            error = mirror.wait_durable(step, self.step_folder(step), self.upload_timeout_s)
        if not agree([error is not None], self.group)[0]:
            return
        if error is None:
            raise StorageError(
                "rank 0 could not make the last checkpoint durable in S3 (its log says why); "
                "stopping with it",
                on_another_rank=True,
            )
        raise StorageError(
            f"the last checkpoint, step-{step}, is complete in {self.step_folder(step)} but could "
            f"not be made durable in {self.checkpoint_uri}: {error}. Fix the S3 access "
            "(credentials, endpoint, bucket, network) and run again with the same "
            "--checkpoint-dir: the run then uploads it first"
        )
