"""The whole pipeline through kfp.local with the local PyTorchJob backend and the test S3 server.

Tiny data and model, one epoch: these check the wiring and both branches of the gate, not the
accuracy (tests/demo does that on real data).
"""

from pathlib import Path

import pytest

from components.s3_sync import sync
from pipelines.training import run_local
from tests.image_data import write_image_folder

pytestmark = pytest.mark.slow


@pytest.fixture
def dataset_uri(s3_server, monkeypatch, tmp_path_factory) -> str:
    """A tiny ImageFolder uploaded to the test server; the AWS env points at the server."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("S3SYNC_CACHE_DIR", str(tmp_path_factory.mktemp("sync-cache")))
    bucket = s3_server.create_bucket("pipeline-local-run")
    data = write_image_folder(tmp_path_factory.mktemp("dataset") / "data", per_class=8)
    uri = f"s3://{bucket}/data"
    sync(str(data), uri)
    return uri


def _arguments(data_uri: str, s3_server, threshold: float, publish_uri: str) -> dict:
    return {
        "data_uri": data_uri,
        "s3_endpoint": s3_server.endpoint_url,
        "workers": 2,
        "gpus_per_worker": 0,
        "model": "mobilenet_v3_small",
        "image_size": 16,
        "epochs": 1,
        "batch_size": 4,
        "accuracy_threshold": threshold,
        "publish_uri": publish_uri,
    }


def _published(s3_server, uri: str) -> list[str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listing = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"][len(prefix) :] for o in listing.get("Contents", []))


def test_gate_passes_and_the_model_is_published(dataset_uri, s3_server, tmp_path):
    publish = f"{dataset_uri.rsplit('/', 1)[0]}/models-passed"
    run = run_local(_arguments(dataset_uri, s3_server, 0.0, publish), workspace=tmp_path / "ws")
    assert run.passed is True
    assert run.data_sync["files"] == 3 * (8 + 4) and run.data_sync["transferred"] == 36
    assert run.training["world_size"] == 2 and run.training["steps"] > 0
    assert 0.0 <= run.metrics["accuracy"] <= 1.0 and run.metrics["num_samples"] == 12
    assert run.report is not None and "<img" in run.report.read_text()
    assert run.published_uri and run.published_uri.startswith(publish + "/")
    files = _published(s3_server, run.published_uri)
    assert {"weights.pt", "model.json", "summary.json", "eval.json", "report.html"} <= set(files)
    # The checkpoints of the run live in the workspace, per data digest and configuration.
    digest = run.data_sync["digest"]
    assert list(Path(tmp_path / "ws" / "train").glob(f"*/{digest}/checkpoints/step-*/COMPLETE"))


def test_gate_fails_and_nothing_is_published(dataset_uri, s3_server, tmp_path):
    # An accuracy of 1.0 on noisy data after one epoch is not reachable: the gate must hold.
    publish = f"{dataset_uri.rsplit('/', 1)[0]}/models-failed"
    run = run_local(_arguments(dataset_uri, s3_server, 1.0, publish), workspace=tmp_path / "ws")
    assert run.passed is False
    assert run.published_uri is None
    assert _published(s3_server, publish + "/") == []
