"""``kfp-ddp render`` prints exactly the job the pipeline's training step submits (name included).

The step runs as it runs in a pod — ``run_training_step`` with a Model artifact under a KFP run's
URI, its kubeconfig the launcher's ServiceAccount's — against the real API server, whose audit
log keeps what it was sent; the test plays the kubelet so the job completes. Render gets the same
pipeline parameters, run id and data digest through the CLI. Both go through
``pipelines.plan.training_step_inputs`` and ``components.launcher.step.training_spec``.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from kfp import dsl

from components.launcher.step import TrainingStepInputs, run_training_step
from components.s3_sync import S3SyncError
from pipelines.cli import declared_inputs, default_arguments, main, parse_parameters
from pipelines.dataset import snapshot_path
from pipelines.plan import (
    DEFAULT_STORAGE,
    STORAGE_MODES,
    WORKSPACE_MOUNT_PATH,
    checkpoint_base,
    training_step_inputs,
)
from pipelines.training import build_training_pipeline
from tests import yaml_fast
from tests.launcher.k8s_helpers import bodies_sent, created, kubeconfig_of, succeed

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
    "namespace=NAMESPACE",
    "-p",
    "epochs=3",
    "-p",
    "model=resnet50",
    "-p",
    'trainer_args=["--augment", "none"]',
    "-p",
    'overrides_json={"shm_size": "4Gi", "labels": {"team": "cv"}, '
    '"backend_options": {"config_file": "KUBECONFIG", "poll_interval_s": 1}}',
]


def with_kubeconfig(params: list[str], path, namespace: str) -> list[str]:
    return [p.replace("KUBECONFIG", str(path)).replace("NAMESPACE", namespace) for p in params]


def rendered(ns, *params: str, storage: str = DEFAULT_STORAGE) -> dict:
    (job,) = rendered_documents(ns, *params, storage=storage)
    return job


def rendered_documents(ns, *params: str, storage: str = DEFAULT_STORAGE) -> list[dict]:
    args = ["render", "--run-id", RUN_ID, "--data-digest", DIGEST, "--storage", storage]
    args += [*PARAMS, *params]
    result = CliRunner().invoke(main, with_kubeconfig(args, "/nowhere/kubeconfig", ns.name))
    assert result.exit_code == 0, result.output
    return list(yaml_fast.safe_load_all(result.stdout))


def submitted(ns, tmp_path, *params: str, **options) -> dict:
    """Run the training step on the cluster; return the manifest it created."""
    (job,) = submitted_documents(ns, tmp_path, *params, **options)
    return job


def submitted_documents(
    ns, tmp_path, *params: str, api: str = "trainjob", storage=DEFAULT_STORAGE
) -> list[dict]:
    """Run the training step on the cluster (``api``: the one it will pick); return everything
    it created, as the API server received it."""
    name = rendered_documents(ns, *params, storage=storage)[0]["metadata"]["name"]
    ns.scenario(api, name, succeed(workers=2, lines=1))
    pipeline = build_training_pipeline(storage=storage)
    pipeline_inputs = declared_inputs(json_format.MessageToDict(pipeline.pipeline_spec))
    # The step finds the cluster the way kubectl does: a kubeconfig naming the stand-in (passed
    # as a backend option, which is not part of the manifest).
    kubeconfig = tmp_path / "kubeconfig"
    pairs = [p for p in with_kubeconfig([*PARAMS, *params], kubeconfig, ns.name) if p != "-p"]
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
    kubeconfig_of(ns.launcher_configuration(), kubeconfig)
    # No trainer wrote a model: in the shared folder, or under the run's S3 output.
    with bodies_sent() as sent, pytest.raises((FileNotFoundError, S3SyncError), match="lack|S3"):
        run_training_step(inputs, model=model, metrics=metrics)
    kinds = ("TrainJob", "PyTorchJob", "PodMonitor", "PrometheusRule", "Service", "ServiceMonitor")
    documents = [body for body in sent if body.get("kind") in kinds]
    # ... and the API server took each of them (its audit log), nothing else.
    assert [d["kind"] for d in created(ns)] == [d["kind"] for d in documents]
    return documents


@pytest.mark.slow
@pytest.mark.parametrize("storage", STORAGE_MODES)
@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_render_equals_what_the_step_submits(k8s, tmp_path, api, storage):
    job = submitted(k8s, tmp_path, "-p", f"api={api}", api=api, storage=storage)
    assert job == rendered(k8s, "-p", f"api={api}", storage=storage)
    assert job["metadata"]["name"].startswith("train-")
    assert job["metadata"]["labels"]["kfp-ddp.io/run-id"] == RUN_ID


def test_auto_on_a_cluster_without_trainer_v2_submits_the_pytorchjob_render_shows(
    operator_k8s, tmp_path
):
    job = submitted(operator_k8s, tmp_path, api="pytorchjob")
    assert job["kind"] == "PyTorchJob"
    assert job == rendered(operator_k8s, "-p", "api=pytorchjob")
    assert rendered(operator_k8s)["kind"] == "TrainJob"  # auto renders what Kubeflow runs now


def test_render_with_metrics_port_prints_what_the_step_creates(k8s, tmp_path):
    """The job, its PodMonitor and PrometheusRule: the same documents, in the same order (the
    ownerReference to the job's uid is the cluster's part: the uid exists once the job does)."""
    params = ("-p", "api=pytorchjob", "-p", "metrics_port=9400")
    documents = submitted_documents(k8s, tmp_path, *params, api="pytorchjob")
    for document in documents[1:]:
        (owner,) = document["metadata"].pop("ownerReferences")
        assert (owner["kind"], owner["name"]) == ("PyTorchJob", documents[0]["metadata"]["name"])
    printed = rendered_documents(k8s, "-p", "api=pytorchjob", "--metrics-port", "9400")
    assert [d["kind"] for d in printed] == ["PyTorchJob", "PodMonitor", "PrometheusRule"]
    assert documents == printed
