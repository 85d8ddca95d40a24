"""Evaluation: score a trained model folder, decide the pass/fail gate, render an HTML report.

``evaluate`` (plain Python, unit-tested without KFP); its KFP component, which turns the result
into ``Metrics``, ``ClassificationMetrics``, ``HTML`` and a ``passed`` output, is
``components/kfp/evaluate.py``.
"""

from components.evaluate.evaluate import (
    EvalConfig,
    EvalResult,
    EvaluationError,
    ScoreAccumulator,
    decide_gate,
    evaluate,
    load_baseline,
    run_evaluation,
)
from components.evaluate.report import render_report, write_report

__all__ = [
    "EvalConfig",
    "EvalResult",
    "EvaluationError",
    "ScoreAccumulator",
    "decide_gate",
    "evaluate",
    "load_baseline",
    "render_report",
    "run_evaluation",
    "write_report",
]
