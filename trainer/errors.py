"""The two permanent failure kinds the trainer reports with their own exit codes."""

from __future__ import annotations

# Exit codes. The Training Operator's ExitCode restart policy treats 1-127 as permanent and
# 128-255 as retryable, so bad input must stay below 128 and a SIGTERM checkpoint above it.
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_DATA = 3
EXIT_SIGTERM = 143  # 128 + SIGTERM


class ConfigError(ValueError):
    """Invalid flags or config file values (exit 2). Messages name the flag, value and fix."""


class DataError(RuntimeError):
    """Unusable input data (exit 3). Messages name the offending path."""
