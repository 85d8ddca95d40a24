"""What a backend returns (``JobResult``) and raises (``JobFailed`` and its kinds)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(kw_only=True)
class JobResult:
    """The outcome of one job run, from either backend."""

    name: str
    """Job name."""
    api: str = ""
    """The API it ran as: trainjob or pytorchjob (local: the env contract it used)."""
    namespace: str
    """Job namespace (the spec's, also for the local backend)."""
    backend: str
    """``kubernetes`` or ``local``."""
    phase: str
    """Final phase: Succeeded, Failed, Timeout or Cancelled."""
    duration_s: float
    """Seconds from submit to the final phase."""
    restarts: int = 0
    """Replica restarts seen (container restarts on a cluster, group restarts locally)."""
    log_tail: list[str] = field(default_factory=list)
    """Last log lines, prefixed with their replica (``[worker-1] ...``)."""
    summary: dict[str, Any] | None = None
    """The trainer's summary.json when it was readable."""
    reason: str = ""
    """Why the job did not succeed (empty on success)."""
    reattached: bool = False
    """The job already existed for this run and was followed instead of created."""
    watchdog: list[str] = field(default_factory=list)
    """Watchdog reports (pods Pending too long, replicas silent too long)."""
    trainer_status: dict[str, Any] | None = None
    """The last ``status.trainerStatus`` seen while following the job (a TrainJob whose trainer
    reports progress; None elsewhere)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JobFailed(RuntimeError):
    """The job failed; ``result`` holds the phase, reason and log tail."""

    def __init__(self, message: str, result: JobResult | None = None):
        super().__init__(message)
        self.result = result


class JobTimeout(JobFailed):
    """The job ran past its time limit (it was deleted / its processes stopped)."""


class JobCancelled(JobFailed):
    """SIGTERM (e.g. the pipeline run was cancelled): the job was deleted, then we stop."""


class PreflightError(RuntimeError):
    """The cluster cannot run the job (no CRD, no permission, no namespace)."""


class JobExists(RuntimeError):
    """A job of that name exists and does not belong to this run."""


def read_summary(output_dir: str | Path | None) -> dict[str, Any] | None:
    """``output_dir/summary.json`` as a dict, or None when missing/unreadable."""
    if not output_dir:
        return None
    try:
        data = json.loads((Path(output_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
