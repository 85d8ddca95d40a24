"""The permanent failures the trainer reports in one line, each with its own exit code."""

from __future__ import annotations

# Exit codes. The Training Operator's ExitCode restart policy treats 1-127 as permanent and
# 128-255 as retryable, so bad input must stay below 128 and a SIGTERM checkpoint above it.
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_DATA = 3
EXIT_STORAGE = 4
EXIT_MEMORY = 5
EXIT_SIGTERM = 143  # 128 + SIGTERM
EXIT_PEER_LOST = 200
"""Another rank died or hung (a collective failed or timed out): retryable, a restart of the
whole job resumes from the last checkpoint. Above every 128 + signal code, so it is unambiguous."""

ERROR_SOURCE = "trainer.train"
"""Marks the torchelastic error files the trainer writes (see trainer.torchrun)."""


class TrainerError(Exception):
    """A permanent failure: one line naming what is wrong and the fix, then ``exit_code``.

    ``on_another_rank``: this rank stops because another one failed; the cause is in that rank's
    log (so this message is not the one to show as the job's root cause).
    """

    exit_code = 1

    def __init__(self, message: str, *, on_another_rank: bool = False):
        super().__init__(message)
        self.on_another_rank = on_another_rank


class ConfigError(TrainerError, ValueError):
    """Invalid flags, config file values or environment (exit 2). Names the flag, value and fix."""

    exit_code = EXIT_CONFIG


class DataError(TrainerError, RuntimeError):
    """Unusable input data (exit 3). Messages name the offending path."""

    exit_code = EXIT_DATA


class StorageError(TrainerError, RuntimeError):
    """A checkpoint or output could not be written, e.g. the disk is full (exit 4).

    Permanent: a restart would hit the same full disk; the message says what to free or change.
    """

    exit_code = EXIT_STORAGE


class OutOfMemory(TrainerError, RuntimeError):
    """A process ran out of its GPU's or its node's memory (exit 5). Permanent: a restart with
    the same batch and images needs the same memory; the message names the settings to lower."""

    exit_code = EXIT_MEMORY
