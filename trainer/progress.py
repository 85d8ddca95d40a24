"""The trainer's progress figures, defined once for everywhere they are reported and shown.

Rank 0 keeps the loop's latest figures (:class:`ProgressTracker`) and hands each snapshot
(:class:`Progress`) to Kubeflow Trainer's status server when the TrainJob takes reports
(:mod:`trainer.trainjob_status`); the final snapshot also goes into ``summary.json`` under
``"progress"``, in the same form, so that every API and backend ends with it. The launcher reads
both back with :class:`ProgressReport`: one step-log line per new ``status.trainerStatus`` while it
follows a TrainJob, and the final figures in the training step's Metrics output.

The form is the TrainJob's ``trainerStatus``: ``progressPercentage`` (0-100),
``estimatedRemainingSeconds``, ``metrics`` (``[{"name", "value"}]``, values short strings: what the
API stores) and ``lastUpdatedTime``. A figure's value text (:func:`metric_text`) is what the
status holds, what the launcher's line shows and what its Metrics output parses back.

Standard library only: the launcher imports this module without torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

INT32_MAX = 2**31 - 1
METRIC_ORDER = (
    "loss",
    "val_loss",
    "val_accuracy",
    "images_per_second",
    "learning_rate",
    "epoch",
    "step",
    "total_steps",
)
"""The trainer's figures, in the order they are listed (``kubectl describe``, the launcher's
line); a program of its own may report other names, listed after these."""
SUMMARY_KEY = "progress"
"""Where ``summary.json`` holds the final figures (a ``trainerStatus`` object)."""
PERCENT_METRIC = "progress_percentage"
ETA_METRIC = "estimated_remaining_seconds"
"""The Metrics output's names for the status's two numbers beside its ``metrics``."""
VALUE_CHARS = 64
"""The API's limit for a metric's name and value (the launcher shows no more either)."""


def metric_text(value: float | int) -> str:
    """A figure's value as the API wants it: a short string (``0.2347``, ``1200``, ``nan``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{float(value):.6g}"


def duration(seconds: float) -> str:
    """``1h05m`` or ``4m07s``."""
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _rank(name: str) -> int:
    return METRIC_ORDER.index(name) if name in METRIC_ORDER else len(METRIC_ORDER)


# ------------------------------------------------------------------------------ the trainer's side
@dataclass(frozen=True, kw_only=True)
class Progress:
    """One snapshot of the figures: the loop's latest, as it saw them at ``observed_at``."""

    step: int
    total_steps: int
    eta_s: float | None
    """Seconds left at the recent step rate (None: not measured yet)."""
    metrics: dict[str, float | int] = field(default_factory=dict)
    observed_at: float = field(default_factory=time.time)
    final: bool = False
    """The run is complete: reported at once, and the end of the run waits for it."""

    def trainer_status(self) -> dict[str, Any]:
        """The ``trainerStatus`` object of this snapshot."""
        status: dict[str, Any] = {}
        if self.total_steps > 0:
            status["progressPercentage"] = max(0, min(100, self.step * 100 // self.total_steps))
        if self.eta_s is not None and math.isfinite(self.eta_s):
            status["estimatedRemainingSeconds"] = max(0, min(INT32_MAX, round(self.eta_s)))
        names = sorted(self.metrics, key=lambda n: (_rank(n), n))
        status["metrics"] = [{"name": n, "value": metric_text(self.metrics[n])} for n in names]
        stamp = datetime.fromtimestamp(self.observed_at, UTC)
        status["lastUpdatedTime"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")  # as metav1.Time writes it
        return status


class ProgressTracker:
    """The loop's latest figures: each update changes the ones it names and returns a snapshot."""

    def __init__(self) -> None:
        self._figures: dict[str, float | int] = {}
        self._eta_s: float | None = None

    def update(
        self,
        *,
        step: int,
        total_steps: int,
        eta_s: float | None = None,
        final: bool = False,
        **figures: float | int | None,
    ) -> Progress:
        """Merge the loop's latest figures (None: unchanged); the snapshot after them."""
        self._figures.update({name: v for name, v in figures.items() if v is not None})
        self._figures.update(step=step, total_steps=total_steps)
        if eta_s is not None:
            self._eta_s = eta_s
        return Progress(
            step=step,
            total_steps=total_steps,
            eta_s=0.0 if final else self._eta_s,
            metrics=dict(self._figures),
            final=final,
        )


# ----------------------------------------------------------------------------- the launcher's side
@dataclass(frozen=True, kw_only=True)
class ProgressReport:
    """A ``trainerStatus`` read back: what the launcher logs and puts into Metrics.

    Equal reports hold the same figures (``updated`` is left out: a report that only restamps
    them is no news).
    """

    percent: int | None
    eta_s: int | None
    figures: tuple[tuple[str, str], ...]
    """(name, value text) as reported, in :data:`METRIC_ORDER`, other names after them."""
    updated: str = field(default="", compare=False)
    """``lastUpdatedTime`` as reported."""

    @classmethod
    def read(cls, status: Any) -> ProgressReport | None:
        """The report in a ``trainerStatus`` object; None when there is none or nothing in it is
        usable. Never raises: whatever a program or an older controller left there, entries of
        the wrong type are skipped."""
        if not isinstance(status, Mapping):
            return None
        percent = _whole(status.get("progressPercentage"), 0, 100)
        eta_s = _whole(status.get("estimatedRemainingSeconds"), 0, INT32_MAX)
        figures: dict[str, str] = {}
        entries = status.get("metrics")
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, Mapping):
                continue
            name, value = entry.get("name"), entry.get("value")
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = metric_text(value)
            if isinstance(name, str) and name.strip() and isinstance(value, str) and value.strip():
                figures.setdefault(_printable(name), _printable(value))
        if percent is None and eta_s is None and not figures:
            return None
        updated = status.get("lastUpdatedTime")
        ordered = tuple(sorted(figures.items(), key=lambda item: (_rank(item[0]), item[0])))
        return cls(
            percent=percent,
            eta_s=eta_s,
            figures=ordered,
            updated=_printable(updated) if isinstance(updated, str) else "",
        )

    def line(self) -> str:
        """``progress 45% | ETA 3m20s | loss 0.2347 | ... | step 450 | total_steps 1000``."""
        parts = []
        if self.percent is not None:
            parts.append(f"progress {self.percent}%")
        if self.eta_s is not None:
            parts.append(f"ETA {duration(self.eta_s)}")
        parts += [f"{name} {value}" for name, value in self.figures]
        return " | ".join(parts)

    def metrics(self) -> dict[str, float]:
        """The figures as numbers, by their reported names, plus :data:`PERCENT_METRIC` and
        :data:`ETA_METRIC`; a value that is not a finite number (``nan``, a word) is left out."""
        numbers: dict[str, float] = {}
        if self.percent is not None:
            numbers[PERCENT_METRIC] = float(self.percent)
        if self.eta_s is not None:
            numbers[ETA_METRIC] = float(self.eta_s)
        for name, value in self.figures:
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                numbers[name] = number
        return numbers


def _whole(value: Any, low: int, high: int) -> int | None:
    """An integer in [low, high], or None (missing, a bool, a string, out of range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value != int(value) or not low <= value <= high:
        return None
    return int(value)


def _printable(text: str) -> str:
    """At most :data:`VALUE_CHARS` characters, on one line (a log line stays one line)."""
    return " ".join(text.split())[:VALUE_CHARS]
