"""The evaluation step as a KFP component: typed artifacts out, ``passed`` as the one return value.

``passed`` is the only return value because a ``dsl.If`` gates the publish step on it, and
``kfp.local`` cannot resolve conditions on NamedTuple outputs. Everything else goes into artifacts:

- ``metrics`` (``Metrics``): accuracy, top_k_accuracy (k = min(5, classes)), loss, num_samples,
  passed (1.0/0.0) — the numbers the
  run's "Scalar metrics" view and run comparison show;
- ``confusion`` (``ClassificationMetrics``): the confusion matrix with class names;
- ``report`` (``HTML``): the page with the verdict, curves and heat map. Its metadata also holds
  the result (``report.metadata["eval"]`` = ``EvalResult.metadata_dict()``) plus ``passed`` and
  ``reason``;
- ``evaluation`` (``Artifact``): the whole result as a JSON file (``EvalResult.to_dict()``), which
  the publish step uploads as ``eval.json``.

Why a file of its own: metadata goes through ML Metadata's gRPC API, capped at 4 MiB on most KFP
backends, and an ImageNet evaluation's confusion matrix alone is 11 MB there
(``components.evaluate.confusion``); ``report.path`` is the HTML file itself, not a folder (a
sibling file would not be uploaded on a cluster), and a ``Metrics`` artifact should hold only
numbers (the UI tabulates every entry as a scalar).
"""

# No `from __future__ import annotations`: KFP reads the artifact types from real annotations.
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Input, Metrics, Model, Output
from kfp.dsl.python_component import PythonComponent

from components import DEFAULT_IMAGE
from components.kfp.factory import make_component


def evaluate_component(
    model: Input[Model],
    data_dir: str,
    threshold: float,
    baseline_uri: str,
    tolerance: float,
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
    report: Output[HTML],
    evaluation: Output[Artifact],
    endpoint_url: str = "",
) -> bool:
    """Score the trained model on data_dir/val/ and say whether it may be published.

    Args:
        model: the trainer's model folder (weights.pt, model.json, and metrics.jsonl for curves).
        data_dir: the data set holding val/<class>/*: a folder (the workspace volume) or its
            s3://bucket/prefix (val/ is downloaded first).
        threshold: minimum accuracy, in [0, 1].
        baseline_uri: empty for no baseline, else a local JSON file or s3://bucket/key of a
            previous model's metrics ({"accuracy": ...}, e.g. its eval.json or summary.json); S3
            endpoint and credentials come from the standard AWS environment.
        tolerance: how far below the baseline's accuracy still passes, in [0, 1].
        endpoint_url: S3 endpoint for an s3:// data_dir or baseline_uri (MinIO, Ceph...); empty
            for AWS or the environment's AWS_ENDPOINT_URL_S3.

    Returns:
        metrics: accuracy, top_k_accuracy (top-5, or top-k with fewer classes), loss, num_samples
            and passed (1.0 or 0.0).
        confusion: the confusion matrix with the class names (above 50 classes, the 49 with
            the most mistakes and one row for all the others).
        report: the HTML page with the verdict, the training curves, where the TensorBoard
            files are (the model's "tensorboard" metadata) and the confusion heat map;
            its metadata holds the evaluation ("eval": eval.json's numbers, its per-class
            lists up to 50 classes), passed and reason.
        evaluation: the whole evaluation as a JSON file (what the publish step uploads as
            eval.json): accuracy, per-class precision, recall and support, the confusion
            matrix, the gate's verdict.
        Output: whether the model passed: accuracy >= threshold and within tolerance of the
            baseline.
    """
    # KFP runs this function's body alone, in the image: its imports are inside it.
    from components.evaluate.evaluate import evaluate_into_artifacts

    return evaluate_into_artifacts(
        model.path,
        data_dir,
        threshold=threshold,
        baseline_uri=baseline_uri,
        tolerance=tolerance,
        metrics=metrics,
        confusion=confusion,
        report=report,
        evaluation=evaluation,
        endpoint_url=endpoint_url,
        tensorboard=str(model.metadata.get("tensorboard") or ""),  # set by the training step
    )


def make_evaluate_op(image: str = DEFAULT_IMAGE) -> PythonComponent:
    """The evaluation component running on ``image``."""
    return make_component(evaluate_component, image=image)
