"""The HTML report: curves from metrics.jsonl, confusion heat map, escaping, no metrics file."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Metrics

from components.evaluate import EvalResult, EvaluationError, render_report, write_report
from components.evaluate.evaluate import evaluate_into_artifacts
from components.evaluate.report import confusion_figure, read_training_curves
from components.s3_sync import sync

IMG = re.compile(r"<img alt=['\"]([^'\"]+)['\"] src=['\"]data:image/png;base64,([A-Za-z0-9+/=]+)")


def step_artifacts(folder: Path) -> dict[str, Any]:
    """The evaluation step's output artifacts as KFP's executor hands them over, under
    ``folder`` (``.path`` follows ``.uri`` for local paths)."""
    artifacts = {
        "metrics": Metrics(), "confusion": ClassificationMetrics(), "report": HTML(),
        "evaluation": Artifact(),
    }  # fmt: skip
    for name, artifact in artifacts.items():
        artifact.uri = str(folder / name)
    return artifacts


def small_result(**changes) -> EvalResult:
    fields = dict(
        accuracy=0.75,
        top_k_accuracy=1.0,
        top_k=2,
        loss=0.5,
        num_samples=4,
        class_names=["cat", "dog"],
        precision=[1.0, 0.5],
        recall=[0.5, 1.0],
        support=[2, 2],
        confusion=[[1, 1], [0, 2]],
        passed=True,
        reason="accuracy 0.75 ≥ threshold 0.5 (no baseline)",
        threshold=0.5,
        tolerance=0.01,
    )
    return EvalResult(**(fields | changes))


def write_metrics_jsonl(path: Path) -> Path:
    rows = [
        {"type": "train", "step": s, "epoch": s // 3, "loss": 2.0 / (s + 1), "lr": 0.1,
         "images_per_sec": 100.0, "elapsed_s": s * 0.1}
        for s in range(1, 7)
    ] + [
        {"type": "val", "step": 3, "epoch": 0, "val_loss": 0.9, "val_accuracy": 0.6},
        {"type": "val", "step": 6, "epoch": 1, "val_loss": 0.5, "val_accuracy": 0.75},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"type": "tra')
    return path


def pngs(html: str) -> dict[str, bytes]:
    return {alt: base64.b64decode(data) for alt, data in IMG.findall(html)}


def test_report_with_curves_and_confusion(tmp_path):
    html = render_report(small_result(), metrics_jsonl=write_metrics_jsonl(tmp_path / "m.jsonl"))

    images = pngs(html)
    assert set(images) == {"training curves", "confusion matrix"}
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in images.values())
    assert "<strong>PASSED</strong>: accuracy 0.75 ≥ threshold 0.5 (no baseline)" in html
    assert "<th>top-2 accuracy</th><td class='num'>1.0000</td>" in html
    assert "<tr><td>dog</td><td class='num'>0.5000</td><td class='num'>1.0000</td>" in html
    assert "1 line(s) of metrics.jsonl were not readable" in html  # the torn last line
    assert "http" not in html.replace("<!DOCTYPE html>", "")  # self-contained: fetches nothing


def test_report_without_metrics_jsonl_still_renders(tmp_path):
    html = render_report(small_result(passed=False, reason="accuracy 0.75 < threshold 0.9"),
                         metrics_jsonl=tmp_path / "absent.jsonl")  # fmt: skip

    assert set(pngs(html)) == {"confusion matrix"}
    assert "No training curves: metrics.jsonl was not found" in html
    assert "<strong>FAILED</strong>: accuracy 0.75 &lt; threshold 0.9" in html
    assert render_report(small_result()).count("<img") == 1  # no path at all


def test_interpolated_text_is_escaped():
    html = render_report(
        small_result(class_names=["<script>alert(1)</script>", "a&b"], arch='"><b>x')
    )
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "a&amp;b" in html
    assert '"><b>x' not in html


def test_class_names_with_dollar_signs_are_drawn_as_written():
    """Matplotlib reads text between two '$' as a TeX formula: a class folder named so was drawn
    as a formula, or failed the whole step when it is not one (``$\\frac{$``)."""
    names = ["$\\frac{$", "x^2_y"]
    html = render_report(small_result(class_names=names))  # where the formula failed
    assert html.count("data:image/png;base64,") == 1  # the confusion matrix (no curves here)
    axes = confusion_figure(names, [[1, 1], [0, 2]]).axes[0]
    for ticks in (axes.get_xticklabels(), axes.get_yticklabels()):
        assert [t.get_text() for t in ticks] == names
        assert not any(t.get_parse_math() for t in ticks)


def test_curves_reader_keeps_train_and_val_rows(tmp_path):
    curves = read_training_curves(write_metrics_jsonl(tmp_path / "m.jsonl"))
    assert curves.train_step == [1, 2, 3, 4, 5, 6]
    assert curves.val_step == [3, 6] and curves.val_accuracy == [0.6, 0.75]
    assert curves.skipped_lines == 1
    assert not read_training_curves(tmp_path / "absent.jsonl")


def test_curves_reader_keeps_the_latest_value_of_a_replayed_step(tmp_path):
    # A run resumed from its step-2 checkpoint logs step 3 again.
    rows = [
        {"type": "train", "step": 1, "loss": 3.0},
        {"type": "train", "step": 2, "loss": 2.0},
        {"type": "train", "step": 3, "loss": 1.9},
        {"type": "train", "step": 3, "loss": 1.5},
        {"type": "val", "step": 3, "val_loss": 1.0, "val_accuracy": 0.5},
        {"type": "val", "step": 3, "val_loss": 0.9, "val_accuracy": 0.6},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    curves = read_training_curves(path)
    assert (curves.train_step, curves.train_loss) == ([1, 2, 3], [3.0, 2.0, 1.5])
    assert (curves.val_step, curves.val_loss, curves.val_accuracy) == ([3], [0.9], [0.6])


def test_write_report_is_atomic(tmp_path):
    path = write_report(small_result(), tmp_path / "report.html")
    assert path.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temp file left


def test_rendering_leaves_matplotlib_global_state_alone():
    # A fresh interpreter: other tests in the session may have imported pyplot themselves.
    # dict.__getitem__ reads the raw rcParam; rcParams["backend"] would resolve it via pyplot.
    code = (
        "import sys, matplotlib\n"
        "from components.evaluate import report\n"
        "assert 'torch' not in sys.modules and 'matplotlib.pyplot' not in sys.modules\n"
        "before = dict.__getitem__(matplotlib.rcParams, 'backend')\n"
        "from tests.evaluate.test_evaluate_report import small_result\n"
        "report.render_report(small_result())\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "assert dict.__getitem__(matplotlib.rcParams, 'backend') == before, 'backend changed'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_evaluate_into_kfp_artifact_objects(tmp_path, colour_model, colour_data):
    artifacts = step_artifacts(tmp_path)
    passed = evaluate_into_artifacts(
        str(colour_model), str(colour_data), threshold=0.5, baseline_uri="", tolerance=0.01,
        **artifacts,
    )  # fmt: skip
    metrics, confusion, report = artifacts["metrics"], artifacts["confusion"], artifacts["report"]
    evaluation = artifacts["evaluation"]

    assert passed is False
    assert metrics.metadata == {
        "accuracy": 0.4, "top_k_accuracy": 0.8, "loss": metrics.metadata["loss"],
        "num_samples": 10.0, "passed": 0.0,
    }  # fmt: skip
    assert confusion.metadata["confusionMatrix"]["rows"][0] == {"row": [2, 1, 0, 0, 0, 0]}
    assert [c["displayName"] for c in confusion.metadata["confusionMatrix"]["annotationSpecs"]] == [
        "a", "b", "c", "d", "e", "f"
    ]  # fmt: skip
    assert report.metadata["reason"] == "accuracy 0.4 < threshold 0.5 (no baseline)"
    assert report.metadata["eval"]["confusion_matrix"][2] == [1, 0, 1, 0, 0, 0]
    # six classes: the report's metadata holds all of the evaluation file (eval.json)
    assert json.loads(Path(evaluation.path).read_text()) == report.metadata["eval"]
    html = Path(report.path).read_text()
    assert html.count("<img") == 1  # the colour model folder has no metrics.jsonl


def test_report_names_the_tensorboard_folder():
    location = "s3://models/cats/training/resnet18-s32/ab12/output/tensorboard"
    html = render_report(small_result(), tensorboard=location)
    assert f"<code>{location}</code>" in html
    assert f"<code>tensorboard --logdir {location}</code>" in html
    assert "TensorBoard" not in render_report(small_result())  # no location: no section


def test_data_in_s3_with_a_class_the_model_lacks_is_named_by_its_uri(
    s3_env, tmp_path, colour_model, colour_data
):
    """The step downloads val/ into a temporary folder; its errors name the URI the user set."""
    bucket = s3_env.create_bucket("eval-data")
    uri = f"s3://{bucket}/colours"
    sync(str(colour_data), uri)
    image = next((colour_data / "val" / "a").iterdir())
    s3_env.client().upload_file(str(image), bucket, "colours/val/zebra/1.png")
    artifacts = step_artifacts(tmp_path)
    with pytest.raises(EvaluationError) as err:
        evaluate_into_artifacts(
            str(colour_model), uri, threshold=0.0, baseline_uri="", tolerance=0.01, **artifacts
        )
    assert f"class folders under {uri}/val that are not among" in str(err.value)
    assert "kfp-ddp-eval-" not in str(err.value)
