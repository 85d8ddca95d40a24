"""The KFP component through kfp.local: typed artifacts out, ``passed`` as the single output."""

# No `from __future__ import annotations`: KFP reads types from real annotations.

import json
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
from kfp import dsl, local
from kfp.dsl import HTML, ClassificationMetrics, Metrics, Model, Output

from components.kfp.evaluate import make_evaluate_op
from components.kfp.factory import make_component
from tests.kfp_local import workspace_root


def stage_model(source: str, model: Output[Model]):
    """Copy a model folder into a Model artifact (what the training step hands over)."""
    import shutil

    shutil.copytree(source, model.path)


class Outputs(NamedTuple):
    passed: bool
    metrics: Metrics
    confusion: ClassificationMetrics
    report: HTML


@pytest.fixture
def model_with_curves(tmp_path, colour_model) -> Path:
    model = tmp_path / "model"
    shutil.copytree(colour_model, model)
    rows = [
        {"type": "train", "step": 1, "epoch": 0, "loss": 1.5, "lr": 0.1},
        {"type": "train", "step": 2, "epoch": 0, "loss": 1.1, "lr": 0.1},
        {"type": "val", "step": 2, "epoch": 0, "val_loss": 1.2, "val_accuracy": 0.4},
    ]
    (model / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model


# kfp.local warns that our image is not a Python image; it runs the step in this venv anyway.
@pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning")
def test_component_through_kfp_local(tmp_path, model_with_curves, colour_data):
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        workspace_root=workspace_root(tmp_path),
    )
    stage = make_component(stage_model)
    evaluate_op = make_evaluate_op()
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"accuracy": 0.45}))

    @dsl.pipeline
    def evaluate_pipeline(source: str, data_dir: str, baseline_uri: str) -> Outputs:
        model = stage(source=source)
        evaluation = evaluate_op(
            model=model.outputs["model"],
            data_dir=data_dir,
            threshold=0.3,
            baseline_uri=baseline_uri,
            tolerance=0.01,
        )
        return Outputs(
            passed=evaluation.outputs["Output"],
            metrics=evaluation.outputs["metrics"],
            confusion=evaluation.outputs["confusion"],
            report=evaluation.outputs["report"],
        )

    run = evaluate_pipeline(
        source=str(model_with_curves), data_dir=str(colour_data), baseline_uri=str(baseline)
    )

    # The colour model scores 0.4: above the threshold, 0.05 below the baseline → fails.
    assert run.outputs["passed"] is False
    metrics = run.outputs["metrics"].metadata
    assert {k: metrics[k] for k in ("accuracy", "top_k_accuracy", "num_samples", "passed")} == {
        "accuracy": 0.4, "top_k_accuracy": 0.8, "num_samples": 10.0, "passed": 0.0
    }  # fmt: skip
    assert metrics["loss"] > 0
    matrix = run.outputs["confusion"].metadata["confusionMatrix"]
    assert [spec["displayName"] for spec in matrix["annotationSpecs"]] == list("abcdef")
    assert [row["row"] for row in matrix["rows"]][:3] == [[2, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0],
                                                          [1, 0, 1, 0, 0, 0]]  # fmt: skip
    report = run.outputs["report"]
    assert report.metadata["reason"] == "accuracy 0.4 is 0.05 below baseline 0.45 (tolerance 0.01)"
    assert report.metadata["eval"]["baseline_accuracy"] == 0.45
    html = Path(report.path).read_text()
    assert html.count("<img") == 2  # training curves (metrics.jsonl in the Model) + confusion
    assert "<strong>FAILED</strong>" in html
