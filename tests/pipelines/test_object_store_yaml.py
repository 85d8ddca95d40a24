"""The object-store pipeline (the default): no claim anywhere, no credentials, the data step only
lists, and the training step hands the nodes the data URI, its digest and the checkpoint URI."""

from __future__ import annotations

from pathlib import Path

import pytest
from kfp import compiler

from pipelines.training import build_training_pipeline
from tests import yaml_fast
from tests.pipelines.test_training_pipeline_yaml import (
    CREDENTIAL_PATTERNS,
    EXPECTED_PARAMETERS,
    _executor_of,
    _tasks,
)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compiled") / "object_store.yaml"
    compiler.Compiler().compile(build_training_pipeline(storage="object-store"), str(path))
    return path


@pytest.fixture(scope="module")
def docs(compiled: Path) -> tuple[dict, dict]:
    pipeline_doc, platform_doc = [d for d in yaml_fast.safe_load_all(compiled.read_text()) if d]
    return pipeline_doc, platform_doc


def test_no_claim_at_all(compiled: Path, docs: tuple[dict, dict]) -> None:
    text = compiled.read_text()
    for word in ("pvcMount", "createpvc", "deletepvc", "persistentVolumeClaim", "accessModes"):
        assert word.lower() not in text.lower(), word
    pipeline_doc, _ = docs
    declared = set(pipeline_doc["root"]["inputDefinitions"]["parameters"])
    # The UI offers no parameter that does nothing here: the claim's name is not one of them.
    assert declared == set(EXPECTED_PARAMETERS) - {"workspace_pvc"}


def test_no_credential_values(compiled: Path, docs: tuple[dict, dict]) -> None:
    text = compiled.read_text()
    for pattern in CREDENTIAL_PATTERNS:
        assert not pattern.search(text), pattern.pattern
    _, platform_doc = docs
    for executor in platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values():
        assert set(executor) == {"secretAsEnv"}
        (secret,) = executor["secretAsEnv"]
        assert secret["secretNameParameter"] == {
            "componentInputParameter": "pipelinechannel--s3_credentials_secret"
        }


def test_data_step_lists_and_the_nodes_stage(docs: tuple[dict, dict]) -> None:
    pipeline_doc, platform_doc = docs
    tasks = _tasks(pipeline_doc)
    assert "stage-dataset-step" not in tasks
    assert tasks["list-dataset-step"]["cachingOptions"] == {}  # looks at S3 every run
    train = tasks["training-job-component"]["inputs"]["parameters"]
    assert train["data_uri"] == {"componentInputParameter": "pipelinechannel--data_uri"}
    assert train["data_digest"]["taskOutputParameter"] == {
        "outputParameterKey": "digest",
        "producerTask": "list-dataset-step",
    }
    # The checkpoint URI is the check step's answer: checkpoint_uri, or publish_uri/training.
    assert train["checkpoint_uri"]["taskOutputParameter"] == {
        "outputParameterKey": "checkpoint_uri",
        "producerTask": "check-arguments-step",
    }
    assert train["s3_credentials_secret"] == {
        "componentInputParameter": "pipelinechannel--s3_credentials_secret"
    }
    for name in ("data_dir", "output_dir", "pvc_name"):
        assert train[name]["runtimeValue"]["constant"] == "", name
    # The evaluation reads val/ from S3.
    evaluate = tasks["evaluate-component"]["inputs"]["parameters"]
    assert evaluate["data_dir"] == {"componentInputParameter": "pipelinechannel--data_uri"}
    # The training step gets the keys (it downloads the model the nodes uploaded).
    executors = platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert "secretAsEnv" in executors[_executor_of(pipeline_doc, tasks["training-job-component"])]


def test_a_run_scoped_claim_is_refused() -> None:
    with pytest.raises(ValueError, match="workspace_size='50Gi' creates a claim"):
        build_training_pipeline(storage="object-store", workspace_size="50Gi")
