"""The training step without a shared volume: what it asks of its inputs, and the job it builds
(each node stages data_uri checking the digest, writes on its own disk, mirrors to S3), valid
against both official CRDs and free of credential values."""

from __future__ import annotations

import pytest
import yaml

from components.launcher import SpecError, build_manifest
from components.launcher.step import (
    TrainingStepInputs,
    run_folder,
    run_uri,
    tensorboard_location,
    trainer_args_for,
    training_spec,
)
from tests.crds import schema_errors

DIGEST = "ab" * 32
OBJECT_STORE = {
    "data_uri": "s3://datasets/cats",
    "checkpoint_uri": "s3://models/cats/training",
    "s3_endpoint": "https://minio.example.com",
    "s3_credentials_secret": "s3-credentials",
    "data_digest": DIGEST,
    "workers": 2,
    "model_name": "resnet18",
}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_nodes_stage_write_locally_and_mirror_to_s3():
    inputs = TrainingStepInputs(**OBJECT_STORE)
    args = trainer_args_for(inputs)
    assert flag(args, "--data-dir") == "/stage/current"
    assert flag(args, "--output-dir") == run_folder(inputs)
    assert run_folder(inputs).startswith("/stage/output/resnet18-")
    assert run_uri(inputs).startswith("s3://models/cats/training/resnet18-")
    assert run_uri(inputs).endswith(f"/{DIGEST[:16]}")
    assert flag(args, "--checkpoint-uri") == f"{run_uri(inputs)}/checkpoints"
    assert flag(args, "--output-uri") == f"{run_uri(inputs)}/output"
    spec = training_spec(inputs, run_id="r1")
    assert spec.stage_data_uri == "s3://datasets/cats" and spec.stage_data_digest == DIGEST
    assert spec.s3_credentials_secret == "s3-credentials" and spec.pvcs == []


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_the_manifests_are_valid_and_carry_no_credentials(api: str):
    spec = training_spec(TrainingStepInputs(api=api, **OBJECT_STORE), run_id="r1")
    manifest = build_manifest(spec)
    assert schema_errors(api, manifest) == []
    text = yaml.safe_dump(manifest)
    assert f"--expect-digest\n    - {DIGEST}" in text or DIGEST in text
    assert "persistentVolumeClaim" not in text
    assert "secretKeyRef" in text and "AWS_SECRET_ACCESS_KEY" in text
    for pod_key in ("AKIA", "aws_secret_access_key:"):
        assert pod_key not in text


def test_a_shared_volume_step_without_mirror_needs_no_secret():
    inputs = TrainingStepInputs(
        data_dir="/workspace/data/x",
        output_dir="/workspace/train",
        pvc_name="ws",
        pvc_mount_path="/workspace",
        s3_credentials_secret="s3-credentials",
    )
    spec = training_spec(inputs, run_id="r1")
    # The nodes never talk to S3 here: a Secret missing in the job's namespace must not stop
    # them from starting.
    assert spec.s3_credentials_secret is None and spec.stage_data_uri is None
    assert "--checkpoint-uri" not in trainer_args_for(inputs)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "set exactly one"),
        ({"data_dir": "/d", "data_uri": "s3://bkt/d"}, "set exactly one"),
        ({"data_uri": "s3://bkt/d"}, "checkpoint_uri='' with output_dir=''"),
        ({"data_uri": "/local/data", "checkpoint_uri": "s3://bkt/c"}, "data_uri='/local/data'"),
        ({"data_uri": "s3://bkt/d", "checkpoint_uri": "gs://b/c"}, "checkpoint_uri='gs://b/c'"),
    ],
)
def test_unclear_storage_is_refused_naming_the_inputs(given, message):
    with pytest.raises(SpecError, match=message):
        training_spec(TrainingStepInputs(**given), run_id="r1")


def test_metrics_port_reaches_the_spec_and_the_tensorboard_folder_is_named():
    inputs = TrainingStepInputs(**OBJECT_STORE, metrics_port=9400)
    spec = training_spec(inputs, run_id="r1")
    assert spec.metrics_port == 9400
    assert spec.container_args()[-4:] == ["--metrics-port", "9400", "--metrics-job", spec.name]
    assert tensorboard_location(inputs) == f"{run_uri(inputs)}/output/tensorboard"
    shared = TrainingStepInputs(data_dir="/workspace/data", output_dir="/workspace/train")
    assert tensorboard_location(shared) == f"{run_folder(shared)}/tensorboard"
