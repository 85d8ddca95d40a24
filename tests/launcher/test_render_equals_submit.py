"""``kfp-ddp render`` prints exactly the job the pipeline's training step submits (name included).

The step runs as it runs in a pod — ``run_training_step`` with a Model artifact under a KFP run's
URI — against the stand-in API server, which records the job it was sent; render gets the same
pipeline parameters, run id and data digest through the CLI. Both go through
``pipelines.training.training_step_inputs`` and ``components.launcher.step.training_spec``.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from click.testing import CliRunner
from google.protobuf import json_format
from kfp import dsl

from components.launcher.step import TrainingStepInputs, run_training_step
from components.s3_sync import S3SyncError
from pipelines.cli import declared_inputs, default_arguments, main, parse_parameters
from pipelines.dataset import snapshot_path
from pipelines.training import (
    DEFAULT_STORAGE,
    STORAGE_MODES,
    WORKSPACE_MOUNT_PATH,
    build_training_pipeline,
    checkpoint_base,
    training_step_inputs,
)
from tests.launcher.conftest import succeed

RUN_ID = "5d0c5e4e-1111-4a2b-9c3d-0123456789ab"
DIGEST = "sha256-0f3a"
PARAMS = [
    "-p",
    "data_uri=s3://bucket/datasets/cats",
    "-p",
    "publish_uri=s3://bucket/models",
    "-p",
    "workers=2",
    "-p",
    "gpus_per_worker=0",
    "-p",
    "namespace=default",
    "-p",
    "epochs=3",
    "-p",
    "model=resnet50",
    "-p",
    'trainer_args=["--augment", "none"]',
    "-p",
    'train_overrides={"shm_size": "4Gi", "labels": {"team": "cv"}, '
    '"backend_options": {"config_file": "KUBECONFIG", "poll_interval_s": 1}}',
]


def with_kubeconfig(params: list[str], path) -> list[str]:
    return [p.replace("KUBECONFIG", str(path)) for p in params]


def rendered(*params: str, storage: str = DEFAULT_STORAGE) -> dict:
    (job,) = rendered_documents(*params, storage=storage)
    return job


def rendered_documents(*params: str, storage: str = DEFAULT_STORAGE) -> list[dict]:
    args = ["render", "--run-id", RUN_ID, "--data-digest", DIGEST, "--storage", storage]
    args += [*PARAMS, *params]
    result = CliRunner().invoke(main, with_kubeconfig(args, "/nowhere/kubeconfig"))
    assert result.exit_code == 0, result.output
    return list(yaml.safe_load_all(result.stdout))


def submitted(fake_api, tmp_path, *params: str, **options) -> dict:
    """Run the training step against the stand-in; return the manifest it created."""
    (job,) = submitted_documents(fake_api, tmp_path, *params, **options)
    return job


def submitted_documents(
    fake_api, tmp_path, *params: str, served=("trainjob", "pytorchjob"), storage=DEFAULT_STORAGE
) -> list[dict]:
    """Run the training step against the stand-in; return everything it created."""
    fake = fake_api(scenario=succeed(workers=2, lines=1), served=served)
    pipeline = build_training_pipeline(storage=storage)
    pipeline_inputs = declared_inputs(json_format.MessageToDict(pipeline.pipeline_spec))
    # The step finds the cluster the way kubectl does: a kubeconfig naming the stand-in (passed
    # as a backend option, which is not part of the manifest).
    kubeconfig = tmp_path / "kubeconfig"
    pairs = [p for p in with_kubeconfig([*PARAMS, *params], kubeconfig) if p != "-p"]
    arguments = default_arguments(pipeline_inputs) | parse_parameters(pairs, pipeline_inputs)
    arguments |= {"backend": "kubernetes", "workspace_path": WORKSPACE_MOUNT_PATH}
    arguments |= {"storage": storage}
    # What the data and check steps hand the training step: with a shared volume the folder the
    # data step froze for this digest; always the checkpoint base the check step resolved.
    shared = storage == "shared-volume"
    staged = snapshot_path(WORKSPACE_MOUNT_PATH, arguments["data_uri"], None, DIGEST)
    inputs = TrainingStepInputs(
        **training_step_inputs(
            arguments,
            data_dir=str(staged) if shared else "",
            data_digest=DIGEST,
            pvc_name=arguments["workspace_pvc"] if shared else "",
            checkpoint_uri=checkpoint_base(arguments),
        )
    )
    # The step finds its run id in its output artifact's URI, as in a KFP pod.
    root = tmp_path / "mlpipeline" / "v2" / "artifacts" / "kfp-ddp-training" / RUN_ID
    model = dsl.Model(uri=str(root / "training-job-component" / "42" / "model"))
    metrics = dsl.Metrics(uri=str(root / "training-job-component" / "42" / "metrics"))
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stand-in", "cluster": {"server": fake.url}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "stand-in", "user": "me"}}],
                "current-context": "c",
            }
        )
    )
    # No trainer wrote a model: in the shared folder, or under the run's S3 output.
    with pytest.raises((FileNotFoundError, S3SyncError), match="lack|S3"):
        run_training_step(inputs, model=model, metrics=metrics)
    return copy.deepcopy(fake.created_manifests)


@pytest.mark.parametrize("storage", STORAGE_MODES)
@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_render_equals_what_the_step_submits(fake_api, tmp_path, api, storage):
    job = submitted(fake_api, tmp_path, "-p", f"job_api={api}", storage=storage)
    assert job == rendered("-p", f"job_api={api}", storage=storage)
    assert job["metadata"]["name"].startswith("train-")
    assert job["metadata"]["labels"]["kfp-ddp.io/run-id"] == RUN_ID


def test_auto_on_a_cluster_without_trainer_v2_submits_the_pytorchjob_render_shows(
    fake_api, tmp_path
):
    job = submitted(fake_api, tmp_path, served=("pytorchjob",))
    assert job["kind"] == "PyTorchJob"
    assert job == rendered("-p", "job_api=pytorchjob")
    assert rendered()["kind"] == "TrainJob"  # auto renders what a current Kubeflow runs


def test_render_with_metrics_port_prints_what_the_step_creates(fake_api, tmp_path):
    """The job, its PodMonitor and PrometheusRule: the same documents, in the same order (the
    ownerReference to the job's uid is the cluster's part: the uid exists once the job does)."""
    params = ("-p", "job_api=pytorchjob", "-p", "metrics_port=9400")
    created = submitted_documents(fake_api, tmp_path, *params)
    for document in created[1:]:
        (owner,) = document["metadata"].pop("ownerReferences")
        assert (owner["kind"], owner["name"]) == ("PyTorchJob", created[0]["metadata"]["name"])
    printed = rendered_documents("-p", "job_api=pytorchjob", "--metrics-port", "9400")
    assert [d["kind"] for d in printed] == ["PyTorchJob", "PodMonitor", "PrometheusRule"]
    assert created == printed
