"""The training pipeline compiles, matches the committed YAML, parses as a PipelineSpec, and keeps
its kfp-kubernetes settings (workspace PVC, S3 credentials from a Secret) without any secret.

The shared-volume pipeline here; tests/pipelines/test_object_store_yaml.py has the other one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from kfp import compiler
from kfp.pipeline_spec import pipeline_spec_pb2

from pipelines.cli import main
from pipelines.package import PACKAGES
from pipelines.plan import WORKSPACE_MOUNT_PATH
from pipelines.training import PIPELINE_NAME, build_training_pipeline
from tests import yaml_fast

EXPECTED_PARAMETERS = {
    "data_uri": "STRING",
    "publish_uri": "STRING",
    "s3_endpoint": "STRING",
    "s3_credentials_secret": "STRING",
    "workspace_pvc": "STRING",
    "image": "STRING",
    "namespace": "STRING",
    "api": "STRING",
    "workers": "NUMBER_INTEGER",
    "gpus_per_worker": "NUMBER_INTEGER",
    "nproc_per_node": "NUMBER_INTEGER",
    "cpu_request": "STRING",
    "memory_request": "STRING",
    "model": "STRING",
    "init_from": "STRING",
    "epochs": "NUMBER_INTEGER",
    "batch_size": "NUMBER_INTEGER",
    "lr": "NUMBER_DOUBLE",
    "label_smoothing": "NUMBER_DOUBLE",
    "skip_bad_images": "BOOLEAN",
    "image_size": "NUMBER_INTEGER",
    "checkpoint_every_steps": "NUMBER_INTEGER",
    "metrics_port": "NUMBER_INTEGER",
    "checkpoint_uri": "STRING",
    "trainer_args": "LIST",
    "overrides_json": "STRING",
    "retrain_token": "STRING",
    "accuracy_threshold": "NUMBER_DOUBLE",
    "baseline_uri": "STRING",
    "tolerance": "NUMBER_DOUBLE",
}
REQUIRED_PARAMETERS = {"data_uri", "publish_uri"}
"""No default: a real-looking bucket name would read from / publish to a stranger's bucket."""
# Values that must never reach a compiled pipeline (the test S3 server's and AWS's doc examples).
CREDENTIAL_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"wJalrXUtnFEMI"),
    re.compile(r"aws_secret_access_key\s*[:=]", re.IGNORECASE),
    re.compile(r"AWS_SECRET_ACCESS_KEY\s*[:=]\s*['\"]?[A-Za-z0-9/+]{20,}"),
]


def strip_sdk_version(text: str) -> str:
    return re.sub(r"^sdkVersion: .*$", "sdkVersion: <stripped>", text, flags=re.MULTILINE)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compiled") / "training_pipeline.yaml"
    compiler.Compiler().compile(build_training_pipeline(storage="shared-volume"), str(path))
    return path


@pytest.fixture(scope="module")
def docs(compiled: Path) -> tuple[dict, dict]:
    pipeline_doc, platform_doc = [d for d in yaml_fast.safe_load_all(compiled.read_text()) if d]
    return pipeline_doc, platform_doc


@pytest.mark.parametrize("storage", sorted(PACKAGES))
def test_committed_yaml_is_up_to_date(storage: str, tmp_path: Path) -> None:
    committed = PACKAGES[storage]
    assert committed.exists(), f"run `kfp-ddp compile --storage {storage}` and commit the YAML"
    fresh = tmp_path / "fresh.yaml"
    compiler.Compiler().compile(build_training_pipeline(storage=storage), str(fresh))
    assert strip_sdk_version(committed.read_text()) == strip_sdk_version(fresh.read_text()), (
        f"{committed.name} is stale: run `make compile` and commit it"
    )


def test_parses_into_pipeline_spec_with_declared_parameters(docs: tuple[dict, dict]) -> None:
    pipeline_doc, platform_doc = docs
    spec = json_format.ParseDict(pipeline_doc, pipeline_spec_pb2.PipelineSpec())
    json_format.ParseDict(platform_doc, pipeline_spec_pb2.PlatformSpec())
    assert spec.pipeline_info.name == PIPELINE_NAME
    declared = {
        name: pipeline_spec_pb2.ParameterType.ParameterTypeEnum.Name(p.parameter_type)
        for name, p in spec.root.input_definitions.parameters.items()
    }
    assert declared == EXPECTED_PARAMETERS
    # Where the data comes from and where the model goes have no default: the UI demands them.
    defaults = {
        name
        for name, p in spec.root.input_definitions.parameters.items()
        if p.HasField("default_value")
    }
    assert set(EXPECTED_PARAMETERS) - defaults == REQUIRED_PARAMETERS
    # The internal knobs are compile-time settings, not UI parameters.
    assert not {"backend", "workspace_path", "storage"} & set(declared)


def test_parameter_descriptions_read_well_in_the_ui(docs: tuple[dict, dict]) -> None:
    pipeline_doc, _ = docs
    parameters = pipeline_doc["root"]["inputDefinitions"]["parameters"]
    for name, parameter in parameters.items():
        description = parameter.get("description", "")
        assert description, f"{name} has no description"
        assert "``" not in description and ":func:" not in description, (name, description)


def test_no_credential_values_anywhere(compiled: Path) -> None:
    text = compiled.read_text()
    for pattern in CREDENTIAL_PATTERNS:
        assert not pattern.search(text), pattern.pattern
    # The only mention of the key names is the Secret → env mapping of kfp-kubernetes.
    _, platform_doc = [d for d in yaml_fast.safe_load_all(text) if d]
    for executor in platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values():
        for secret in executor.get("secretAsEnv", []):
            assert set(secret) <= {"keyToEnv", "optional", "secretNameParameter", "secretName"}


def test_credentials_in_the_environment_never_reach_the_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "KEYID-do-not-compile-7f3a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SECRET-do-not-compile-9c1e")
    monkeypatch.setenv("KFP_TOKEN", "TOKEN-do-not-compile-2b4d")
    path = tmp_path / "p.yaml"
    result = CliRunner().invoke(main, ["compile", "--output", str(path)])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    for value in ("7f3a", "9c1e", "2b4d"):
        assert value not in text


def _tasks(pipeline_doc: dict) -> dict[str, dict]:
    """Every task of every DAG, by task name."""
    tasks = dict(pipeline_doc["root"]["dag"]["tasks"])
    for component in pipeline_doc["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


def _executor_of(pipeline_doc: dict, task: dict) -> str:
    return pipeline_doc["components"][task["componentRef"]["name"]]["executorLabel"]


def test_structure_gate_retries_caching_and_exit_handler(docs: tuple[dict, dict]) -> None:
    pipeline_doc, _ = docs
    tasks = _tasks(pipeline_doc)
    # check → data → train → evaluate → (if passed) stage → publish, inside an exit handler.
    assert tasks["stage-dataset-step"]["dependentTasks"] == ["check-arguments-step"]
    # (the check step also answers where checkpoints go: checkpoint_uri or its default)
    assert sorted(tasks["training-job-component"]["dependentTasks"]) == [
        "check-arguments-step",
        "stage-dataset-step",
    ]
    # (the check step also resolves baseline_uri=latest for the evaluation)
    assert sorted(tasks["evaluate-component"]["dependentTasks"]) == [
        "check-arguments-step",
        "stage-dataset-step",
        "training-job-component",
    ]
    # What the run starts from and is compared with: the check step's answers.
    for task, name in (
        ("training-job-component", "init_from"),
        ("evaluate-component", "baseline_uri"),
    ):
        given = tasks[task]["inputs"]["parameters"][name]["taskOutputParameter"]
        assert given == {"outputParameterKey": name, "producerTask": "check-arguments-step"}
    conditions = [
        t["triggerPolicy"]["condition"]
        for t in tasks.values()
        if "condition" in t.get("triggerPolicy", {})
    ]
    assert conditions == [
        "inputs.parameter_values['pipelinechannel--evaluate-component-Output'] == true"
    ]
    # Publishing runs only inside the gate's condition.
    assert set(pipeline_doc["components"]["comp-condition-2"]["dag"]["tasks"]) == {
        "publish-model-step"
    }
    # ... with the evaluation's whole result (eval.json), a file: metadata is size-capped.
    publish = pipeline_doc["components"]["comp-condition-2"]["dag"]["tasks"]["publish-model-step"]
    assert publish["inputs"]["artifacts"]["evaluation"] == {
        "componentInputArtifact": "pipelinechannel--evaluate-component-evaluation"
    }
    # Data-aware caching: the data step always runs, its digest is an input of the training step.
    assert tasks["stage-dataset-step"]["cachingOptions"] == {}
    # Publishing happens in every run that passes (its own run-id prefix), never from a cache.
    assert tasks["publish-model-step"]["cachingOptions"] == {}
    assert tasks["training-job-component"]["cachingOptions"] == {"enableCache": True}
    digest = tasks["training-job-component"]["inputs"]["parameters"]["data_digest"]
    assert digest["taskOutputParameter"] == {
        "outputParameterKey": "digest",
        "producerTask": "stage-dataset-step",
    }
    # Training and evaluation read the data folder the data step froze.
    for task in ("training-job-component", "evaluate-component"):
        data_dir = tasks[task]["inputs"]["parameters"]["data_dir"]
        assert data_dir["taskOutputParameter"] == {
            "outputParameterKey": "data_dir",
            "producerTask": "stage-dataset-step",
        }
    # The API (TrainJob / PyTorchJob / auto) is a pipeline parameter handed to the step.
    assert tasks["training-job-component"]["inputs"]["parameters"]["api"] == {
        "componentInputParameter": "pipelinechannel--api"
    }
    # The launcher step is retried (it re-attaches to its job), at once: a retry after a
    # permanent failure only reads the failure and fails, and no wait should delay that.
    retry = tasks["training-job-component"]["retryPolicy"]
    assert retry["maxRetryCount"] == 2
    assert retry["backoffDuration"] == "0s" and retry["backoffFactor"] == 1.0
    # The exit handler's task deletes leftover TrainJobs/PyTorchJobs of this run.
    root = pipeline_doc["root"]["dag"]["tasks"]
    assert root["cleanup-component"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    run_id = root["cleanup-component"]["inputs"]["parameters"]["run_id"]
    assert run_id["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"


def test_kubernetes_platform_config(docs: tuple[dict, dict]) -> None:
    pipeline_doc, platform_doc = docs
    tasks = _tasks(pipeline_doc)
    executors = platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for task_name in (
        "stage-dataset-step",
        "training-job-component",
        "evaluate-component",
    ):
        config = executors[_executor_of(pipeline_doc, tasks[task_name])]
        (mount,) = config["pvcMount"]
        assert mount["mountPath"] == WORKSPACE_MOUNT_PATH
        assert mount["pvcNameParameter"] == {
            "componentInputParameter": "pipelinechannel--workspace_pvc"
        }
    # Publishing needs no volume: it stages in its own temporary folder, then uploads.
    assert "pvcMount" not in executors[_executor_of(pipeline_doc, tasks["publish-model-step"])]
    # The check reads an s3:// baseline_uri as the evaluation will.
    for task_name in (
        "check-arguments-step",
        "stage-dataset-step",
        "publish-model-step",
        "evaluate-component",
    ):
        (secret,) = executors[_executor_of(pipeline_doc, tasks[task_name])]["secretAsEnv"]
        assert secret["secretNameParameter"] == {
            "componentInputParameter": "pipelinechannel--s3_credentials_secret"
        }
        assert {m["envVar"] for m in secret["keyToEnv"]} == {
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        }
    # The launcher talks to the cluster, never to S3: it gets no credentials.
    assert (
        "secretAsEnv" not in executors[_executor_of(pipeline_doc, tasks["training-job-component"])]
    )


def test_run_scoped_workspace_variant(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(
        build_training_pipeline(
            storage="shared-volume", workspace_size="50Gi", storage_class="nfs"
        ),
        str(path),
    )
    pipeline_doc, platform_doc = [d for d in yaml_fast.safe_load_all(path.read_text()) if d]
    tasks = _tasks(pipeline_doc)
    create = tasks["createpvc"]["inputs"]["parameters"]
    assert create["size"]["runtimeValue"]["constant"] == "50Gi"
    assert create["storage_class_name"]["runtimeValue"]["constant"] == "nfs"
    assert create["access_modes"]["runtimeValue"]["constant"] == ["ReadWriteMany"]
    deletes = [name for name in tasks if name.startswith("deletepvc")]
    assert len(deletes) == 2  # after publishing, and when the gate fails
    executors = platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    mount = executors[_executor_of(pipeline_doc, tasks["training-job-component"])]["pvcMount"][0]
    assert mount["pvcNameParameter"] == {
        "componentInputParameter": "pipelinechannel--createpvc-name"
    }


def test_image_is_a_compile_time_setting(tmp_path: Path) -> None:
    out = tmp_path / "custom.yaml"
    result = CliRunner().invoke(
        main, ["compile", "--image", "reg.example/ddp:7", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    pipeline_doc = next(yaml_fast.safe_load_all(out.read_text()))
    images = {e["container"]["image"] for e in pipeline_doc["deploymentSpec"]["executors"].values()}
    lightweight = {
        e["container"]["image"]
        for e in pipeline_doc["deploymentSpec"]["executors"].values()
        if "executor_main" in " ".join(e["container"].get("command", []))
    }
    assert lightweight == {"reg.example/ddp:7"}
    assert "reg.example/ddp:7" in images
    defaults = pipeline_doc["root"]["inputDefinitions"]["parameters"]
    assert defaults["image"]["defaultValue"] == "reg.example/ddp:7"
    bad = CliRunner().invoke(main, ["compile", "--image", "has space", "--output", str(out)])
    assert bad.exit_code == 1
    assert "image=" in bad.output
