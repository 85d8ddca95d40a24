"""A self-contained HTML evaluation report: verdict, metrics, training curves, confusion heat map.

Pictures are matplotlib PNGs inlined as ``data:`` URIs, so the page is one file that the KFP UI
(or a browser, or an S3 console) shows without fetching anything. Figures are drawn on
``matplotlib.figure.Figure`` objects with the Agg canvas directly: no pyplot, no global backend
switch, nothing left open between reports.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kfp_ddp.atomic_files import write_text_atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from components.evaluate.evaluate import EvalResult

# Above this many classes the heat map drops per-cell counts, then tick labels: unreadable anyway.
_ANNOTATE_MAX_CLASSES = 20
_LABEL_MAX_CLASSES = 60


@dataclass
class TrainingCurves:
    """Series read from the trainer's metrics.jsonl."""

    train_step: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_step: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    skipped_lines: int = 0
    """Lines that were not JSON objects with the expected numbers (e.g. a torn last line)."""

    def __bool__(self) -> bool:
        return bool(self.train_step or self.val_step)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def read_training_curves(path: str | os.PathLike | None) -> TrainingCurves:
    """Train loss and val loss/accuracy by step; an absent file gives empty curves."""
    curves = TrainingCurves()
    if path is None or not Path(path).is_file():
        return curves
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                curves.skipped_lines += 1
                continue
            if not isinstance(row, dict):
                curves.skipped_lines += 1
                continue
            step = _number(row.get("step"))
            if row.get("type") == "train" and step is not None:
                loss = _number(row.get("loss"))
                if loss is None:
                    curves.skipped_lines += 1
                    continue
                curves.train_step.append(step)
                curves.train_loss.append(loss)
            elif row.get("type") == "val" and step is not None:
                loss, accuracy = _number(row.get("val_loss")), _number(row.get("val_accuracy"))
                if loss is None or accuracy is None:
                    curves.skipped_lines += 1
                    continue
                curves.val_step.append(step)
                curves.val_loss.append(loss)
                curves.val_accuracy.append(accuracy)
            else:
                curves.skipped_lines += 1
    # A resumed run logs the steps after its checkpoint again: keep the latest value per step.
    train = dict(zip(curves.train_step, curves.train_loss, strict=True))
    curves.train_step, curves.train_loss = sorted(train), [train[s] for s in sorted(train)]
    val = {
        s: (loss, acc)
        for s, loss, acc in zip(curves.val_step, curves.val_loss, curves.val_accuracy, strict=True)
    }
    curves.val_step = sorted(val)
    curves.val_loss = [val[s][0] for s in curves.val_step]
    curves.val_accuracy = [val[s][1] for s in curves.val_step]
    return curves


def _png_data_uri(figure: Figure) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # attaches itself to the figure
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def curves_figure(curves: TrainingCurves) -> Figure:
    """Loss (train and val) and val accuracy against the optimizer step."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 3.6), layout="constrained")
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    if curves.train_step:
        # Markers when the points are few (a short run logs only a handful), or a line is invisible.
        style = ".-" if len(curves.train_step) < 50 else "-"
        loss_axes.plot(curves.train_step, curves.train_loss, style, label="train loss", lw=1)
    if curves.val_step:
        loss_axes.plot(curves.val_step, curves.val_loss, "o-", label="val loss", lw=1.5)
        accuracy_axes.plot(curves.val_step, curves.val_accuracy, "o-", color="tab:green", lw=1.5)
    losses = [v for v in (*curves.train_loss, *curves.val_loss) if v is not None and v > 0]
    if losses and max(losses) / min(losses) > 100:
        # An early spike (BatchNorm statistics of a fresh model) would flatten the rest.
        loss_axes.set_yscale("log")
    loss_axes.set(title="Loss", xlabel="step", ylabel="cross-entropy")
    loss_axes.legend(loc="upper right")
    accuracy_axes.set(title="Validation accuracy", xlabel="step", ylabel="accuracy")
    accuracy_axes.set_ylim(0, 1.02)
    for axes in (loss_axes, accuracy_axes):
        axes.grid(alpha=0.3)
    return figure


def confusion_figure(class_names: list[str], confusion: list[list[int]]) -> Figure:
    """Heat map coloured by row share (recall per cell), annotated with counts."""
    import numpy as np
    from matplotlib.figure import Figure

    counts = np.asarray(confusion, dtype=np.int64).reshape(len(class_names), len(class_names))
    row_totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, row_totals, out=np.zeros(counts.shape), where=row_totals > 0)
    n = len(class_names)
    side = min(4.0 + 0.45 * n, 16.0)
    figure = Figure(figsize=(side + 1.5, side), layout="constrained")
    axes = figure.subplots()
    image = axes.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    figure.colorbar(image, ax=axes, label="share of the true class", shrink=0.8)
    axes.set(title="Confusion matrix", xlabel="predicted class", ylabel="true class")
    if n <= _LABEL_MAX_CLASSES:
        # As written: a name with two '$' is no TeX formula (an invalid one failed the step).
        labels = [str(c) for c in class_names]
        axes.set_xticks(range(n), labels, rotation=45, ha="right", parse_math=False)
        axes.set_yticks(range(n), labels, parse_math=False)
    if n <= _ANNOTATE_MAX_CLASSES:
        for i in range(n):
            for j in range(n):
                color = "white" if shares[i, j] > 0.5 else "black"
                axes.text(j, i, str(counts[i, j]), ha="center", va="center", color=color)
    return figure


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; max-width: 72rem; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
.verdict { padding: .7rem 1rem; border-radius: 6px; font-size: 1.05rem; }
.passed { background: #e6f4ea; border: 1px solid #34a853; }
.failed { background: #fce8e6; border: 1px solid #d93025; }
table { border-collapse: collapse; }
td, th { padding: .25rem .7rem; border-bottom: 1px solid #ddd; }
th { text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; } .note { color: #666; }
"""


def _row(label: str, value: str) -> str:
    return f"<tr><th>{escape(label)}</th><td class='num'>{escape(value)}</td></tr>"


def render_report(
    result: EvalResult,
    *,
    metrics_jsonl: str | os.PathLike | None = None,
    title: str | None = None,
    tensorboard: str = "",
) -> str:
    """The report page as one HTML string (every interpolated text escaped).

    ``tensorboard``: the folder or S3 URI of the training's TensorBoard files ('' leaves the
    section out)."""
    curves = read_training_curves(metrics_jsonl)
    verdict = "PASSED" if result.passed else "FAILED"
    title = title or f"Evaluation of {result.arch or 'model'} on {result.split}/"
    baseline = "none" if result.baseline_accuracy is None else f"{result.baseline_accuracy:.4f}"
    metrics_rows = "\n".join(
        [
            _row("accuracy", f"{result.accuracy:.4f}"),
            _row(f"top-{result.top_k} accuracy", f"{result.top_k_accuracy:.4f}"),
            _row("mean loss", f"{result.loss:.4f}"),
            _row("images", str(result.num_samples)),
            _row("threshold", f"{result.threshold:.4f}"),
            _row("baseline accuracy", baseline),
            _row("tolerance", f"{result.tolerance:.4f}"),
            _row("device", result.device),
            _row("scoring time", f"{result.seconds:.2f} s"),
        ]
    )
    class_rows = "\n".join(
        f"<tr><td>{escape(str(name))}</td><td class='num'>{p:.4f}</td>"
        f"<td class='num'>{r:.4f}</td><td class='num'>{s}</td></tr>"
        for name, p, r, s in zip(
            result.class_names, result.precision, result.recall, result.support, strict=True
        )
    )
    if curves:
        curves_html = f"<img alt='training curves' src='{_png_data_uri(curves_figure(curves))}'>"
    else:
        curves_html = (
            "<p class='note'>No training curves: metrics.jsonl was not found or held no "
            "train/val rows.</p>"
        )
    if curves.skipped_lines:
        curves_html += (
            f"<p class='note'>{curves.skipped_lines} line(s) of metrics.jsonl were not "
            "readable and were skipped.</p>"
        )
    confusion_uri = _png_data_uri(confusion_figure(result.class_names, result.confusion))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<div class="verdict {verdict.lower()}"><strong>{verdict}</strong>: {escape(result.reason)}</div>
<h2>Metrics</h2>
<table>
{metrics_rows}
</table>
<h2>Training curves</h2>
{curves_html}
{tensorboard_html(tensorboard)}
<h2>Confusion matrix</h2>
<img alt="confusion matrix" src="{confusion_uri}">
<h2>Per class</h2>
<table>
<tr><th>class</th><th>precision</th><th>recall</th><th>images</th></tr>
{class_rows}
</table>
</body>
</html>
"""


def tensorboard_html(location: str) -> str:
    """Where the TensorBoard files are, and how to look at them ('' without a location)."""
    if not location:
        return ""
    return (
        "<h2>TensorBoard</h2>\n"
        "<p class='tensorboard'>The training's TensorBoard files (loss, learning rate, images/s, "
        f"data wait, validation by step): <code>{escape(location)}</code>. Look at them with "
        f"<code>tensorboard --logdir {escape(location)}</code>, or create a Kubeflow "
        "<code>Tensorboard</code> resource pointing at it (README, Monitoring).</p>"
    )


def write_report(
    result: EvalResult,
    path: str | os.PathLike,
    *,
    metrics_jsonl: str | os.PathLike | None = None,
    title: str | None = None,
    tensorboard: str = "",
) -> Path:
    """Render the report and write it to ``path`` atomically."""

    path = Path(path)
    page = render_report(result, metrics_jsonl=metrics_jsonl, title=title, tensorboard=tensorboard)
    write_text_atomic(path, page)
    return path
