"""The trainer's progress in the training step's log and Metrics (figures: ``trainer.progress``).

While the Kubernetes backend follows a job, every state of it that its watch delivers passes
through :meth:`ProgressLog.observe`. A TrainJob's ``status.trainerStatus`` with new figures becomes
one step-log line, ``[launcher] trainer progress: progress 45% | ETA 3m20s | loss 0.2347 | ...``,
so the log grows at the rate the trainer reports (``--progress-report-interval-s``), whatever the
watch delivers; a status only restamped, or none at all (a PyTorchJob, a TFJob, a TrainJob without
Kubeflow Trainer's ``TrainJobStatus`` gate), logs nothing. A status without readable figures is
noted once and never fails the step.

At the end :func:`final_progress` picks the figures the step's Metrics output carries, and the
step logs them as one such line: the trainer's final ones from ``summary.json`` (written on every
API and backend, the same object as its last report), else the last status seen.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from trainer.progress import SUMMARY_KEY, ProgressReport


class ProgressLog:
    """The job's reported progress: a line per change of its figures, the latest kept."""

    def __init__(self, note: Callable[[str], None]):
        self.note = note
        self.latest: ProgressReport | None = None
        """The figures of the last line logged."""
        self.status: dict[str, Any] | None = None
        """The last readable ``status.trainerStatus`` as the job had it (plain data)."""
        self._unreadable_noted = False

    def observe(self, job: Any) -> None:
        """Log the progress in ``job`` (a job object as the API returns it) if it is news."""
        try:
            self._observe(job)
        except Exception as exc:  # noqa: BLE001 - progress is informative: never fail the follow
            self._unreadable(f"{type(exc).__name__}: {exc}")

    def _observe(self, job: Any) -> None:
        status = job.get("status") if isinstance(job, Mapping) else None
        reported = status.get("trainerStatus") if isinstance(status, Mapping) else None
        if reported is None:
            return
        report = ProgressReport.read(reported)
        if report is None:
            self._unreadable(json.dumps(reported, default=str)[:200])
            return
        self.status = copy.deepcopy(dict(reported))
        if report == self.latest:
            return
        self.latest = report
        self.note(f"trainer progress: {report.line()}")

    def _unreadable(self, what: str) -> None:
        if not self._unreadable_noted:
            self._unreadable_noted = True
            self.note(f"the job's status.trainerStatus holds no progress to show ({what}); ignored")


class FinalProgress(NamedTuple):
    """The figures the step's Metrics output carries, and where they come from."""

    report: ProgressReport
    source: str


def final_progress(
    summary: Mapping[str, Any] | None, trainer_status: Mapping[str, Any] | None
) -> FinalProgress | None:
    """The trainer's final figures: ``summary.json``'s, else the last ``status.trainerStatus``
    the launcher saw; None when neither holds any (a program that reports no progress)."""
    written = (summary or {}).get(SUMMARY_KEY)
    report = ProgressReport.read(written)
    if report is not None:
        return FinalProgress(report, "summary.json")
    report = ProgressReport.read(trainer_status)
    if report is not None:
        return FinalProgress(report, "the TrainJob's last status.trainerStatus")
    return None
