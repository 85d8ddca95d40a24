"""The evaluation's error type and the checks of its numbers (shared by its modules)."""

from __future__ import annotations

import math
from typing import Any

EPS = 1e-9
"""Comparisons of accuracies (ratios of counts) with user thresholds tolerate float round-off, so
that accuracy 0.96 is "within 0.01 of baseline 0.97" although 0.97 - 0.96 > 0.01 in binary."""


class EvaluationError(ValueError):
    """The model folder, the data, or an argument cannot be evaluated; the message says the fix."""


def check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EvaluationError(f"{name}={value!r} must be an integer >= {minimum}")


def check_fraction(name: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.0 <= value <= 1.0
    ):
        raise EvaluationError(f"{name}={value!r} is out of range; allowed: 0.0 <= {name} <= 1.0")
