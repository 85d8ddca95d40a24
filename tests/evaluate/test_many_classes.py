"""An ImageNet-sized evaluation (1000 classes) through the KFP step: what goes into artifact
metadata stays far under ML Metadata's 4 MiB message cap, and the whole result is in the
evaluation file that the publish step uploads as eval.json.

Before, the step put the 1000 x 1000 confusion matrix into two artifacts' metadata (22 MB as
protobuf Structs), which a KFP backend refuses ("Received message larger than max") after the
whole training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from google.protobuf import struct_pb2
from PIL import Image

from components.evaluate.confusion import SHOWN_CLASSES
from components.evaluate.evaluate import SHOWN_SKIPPED, evaluate_into_artifacts
from pipelines.publish import read_evaluation
from tests.evaluate.test_evaluate_report import small_result, step_artifacts
from trainer.export import save_model
from trainer.models import build_model

CLASSES = [f"n{i:08d}" for i in range(1000)]
MLMD_MESSAGE_CAP = 4 * 1024 * 1024
"""ML Metadata's gRPC message size on KFP backends before kubeflow/pipelines#12803."""


def struct_bytes(metadata: dict) -> int:
    """The metadata's size as KFP's launcher sends it to ML Metadata: a protobuf Struct."""
    message = struct_pb2.Struct()
    message.update(metadata)
    return len(message.SerializeToString())


@pytest.fixture(scope="module")
def thousand_classes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A ResNet-18 of 1000 classes and val/ with one small picture of each class."""
    folder = tmp_path_factory.mktemp("thousand")
    torch.manual_seed(0)
    model = build_model("resnet18", len(CLASSES))
    save_model(
        folder / "model",
        model.state_dict(),
        arch="resnet18",
        class_names=CLASSES,
        image_size=16,
        mean=[0.5, 0.5, 0.5],
        std=[0.5, 0.5, 0.5],
    )
    rng = np.random.default_rng(0)
    for name in CLASSES:
        (folder / "data" / "val" / name).mkdir(parents=True)
        pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "data" / "val" / name / "0.png")
    return folder / "model", folder / "data"


def test_a_thousand_class_evaluation_fits_kfp_metadata_and_keeps_everything_in_its_file(
    tmp_path, thousand_classes
):
    model_dir, data_dir = thousand_classes
    artifacts = step_artifacts(tmp_path)
    evaluate_into_artifacts(
        str(model_dir), str(data_dir), threshold=0.0, baseline_uri="", tolerance=0.01, **artifacts
    )
    confusion, report, evaluation = (
        artifacts[name] for name in ("confusion", "report", "evaluation")
    )

    sizes = {name: struct_bytes(a.metadata) for name, a in artifacts.items()}
    assert sum(sizes.values()) < MLMD_MESSAGE_CAP / 16, sizes  # all outputs in one message
    matrix = confusion.metadata["confusionMatrix"]
    assert len(matrix["annotationSpecs"]) == SHOWN_CLASSES
    assert matrix["annotationSpecs"][-1]["displayName"] == "(other 951 classes)"
    assert sum(sum(row["row"]) for row in matrix["rows"]) == 1000  # every image counted
    summary = report.metadata["eval"]
    assert summary["num_classes"] == 1000 and summary["num_samples"] == 1000
    assert "confusion_matrix" not in summary and "per_class" not in summary
    assert "in eval.json" in summary["left_out"]

    whole = json.loads(Path(evaluation.path).read_text())
    assert len(whole["confusion_matrix"]) == 1000 and len(whole["per_class"]) == 1000
    assert whole["class_names"] == CLASSES
    assert sum(map(sum, whole["confusion_matrix"])) == 1000
    assert whole["accuracy"] == summary["accuracy"]
    # what the publish step uploads as eval.json: the file, not the shortened metadata
    assert read_evaluation(evaluation.path, report.metadata) == whole


def test_without_the_evaluation_file_publish_falls_back_to_the_reports_metadata(tmp_path):
    metadata = {"eval": {"accuracy": 0.9}, "passed": True}
    assert read_evaluation(None, metadata) == {"accuracy": 0.9}
    assert read_evaluation(None, {}) is None
    broken = tmp_path / "evaluation"
    broken.write_text("<html>")
    with pytest.raises(ValueError, match="not the evaluation step's JSON"):
        read_evaluation(str(broken), metadata)


def test_many_skipped_images_are_counted_in_the_metadata_and_named_in_the_file():
    skipped = [f"val/cat/{i}.jpg" for i in range(500)]
    result = small_result(skipped_images=skipped)
    summary = result.metadata_dict()
    assert summary["skipped_images"] == skipped[:SHOWN_SKIPPED]
    assert summary["skipped_images_total"] == 500
    assert summary["left_out"].startswith(f"skipped_images[{SHOWN_SKIPPED}:]")
    assert result.to_dict()["skipped_images"] == skipped
    assert small_result().metadata_dict() == small_result().to_dict()  # small: all of it
