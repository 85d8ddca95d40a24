"""`kfp-ddp render`, parameter parsing and `run-local` argument checks (no server, no cluster)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from pipelines.cli import kfp_cron, main, parse_parameters
from tests import yaml_fast
from tests.image_data import write_image_folder

INPUTS = {
    "epochs": {"parameterType": "NUMBER_INTEGER", "defaultValue": 10.0, "isOptional": True},
    "lr": {"parameterType": "NUMBER_DOUBLE", "defaultValue": 0.1, "isOptional": True},
    "flag": {"parameterType": "BOOLEAN", "defaultValue": False, "isOptional": True},
    "tags": {"parameterType": "LIST", "defaultValue": [], "isOptional": True},
    "conf": {"parameterType": "STRUCT", "defaultValue": {}, "isOptional": True},
    "name": {"parameterType": "STRING"},
}


REQUIRED = ["-p", "data_uri=s3://bucket/datasets/cats", "-p", "publish_uri=s3://bucket/models"]


def test_parse_parameters_types_values() -> None:
    got = parse_parameters(
        [
            "epochs=3",
            "lr=1e-3",
            "flag=yes",
            'tags=["a", "b"]',
            'conf={"k": 1}',
            "name=a=b",
        ],
        INPUTS,
    )
    assert got == {
        "epochs": 3,
        "lr": 0.001,
        "flag": True,
        "tags": ["a", "b"],
        "conf": {"k": 1},
        "name": "a=b",
    }
    with pytest.raises(click.BadParameter, match="missing required pipeline parameter"):
        parse_parameters(["epochs=1"], INPUTS)
    with pytest.raises(click.BadParameter, match="'tags' expects a JSON list"):
        parse_parameters(["name=x", 'tags={"a": 1}'], INPUTS)
    with pytest.raises(click.BadParameter, match="'flag' expects true or false"):
        parse_parameters(["name=x", "flag=maybe"], INPUTS)


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("0 2 * * *", "0 0 2 * * *"),
        ("  */15   * * * * ", "0 */15 * * * *"),
        ("30 0 2 * * 1-5", "30 0 2 * * 1-5"),
        ("@daily", "@daily"),
    ],
)
def test_cron_gets_the_seconds_field_kfp_expects(given: str, sent: str) -> None:
    assert kfp_cron(given) == sent


def test_render_prints_the_pytorchjob_a_run_would_submit() -> None:
    result = CliRunner().invoke(
        main,
        [
            "render",
            "--storage",
            "shared-volume",
            "-p",
            "api=pytorchjob",
            "-p",
            "data_uri=s3://bucket/datasets/cats",
            "-p",
            "publish_uri=s3://bucket/models",
            "--run-id",
            "3f2b1c4d-0000-4000-8000-000000000001",
            "--data-digest",
            "abc123",
            "-p",
            "workers=3",
            "-p",
            "gpus_per_worker=2",
            "-p",
            "nproc_per_node=2",
            "-p",
            "epochs=4",
            "-p",
            "namespace=team-a",
            "-p",
            'overrides_json={"shm_size": "8Gi", "backend_options": {"timeout_s": 60}}',
        ],
    )
    assert result.exit_code == 0, result.output
    job = yaml_fast.safe_load(result.output)
    assert job["kind"] == "PyTorchJob"
    assert job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"]["kfp-ddp.io/run-id"] == "3f2b1c4d-0000-4000-8000-000000000001"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Worker": 3}  # Workers only
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (2, "2")
    args = container["args"]
    assert args[args.index("--epochs") + 1] == "4"
    # The data folder the data step freezes for this source and digest.
    data_dir = args[args.index("--data-dir") + 1]
    assert data_dir.startswith("/workspace/data/") and data_dir.endswith("/abc123")
    output_dir = args[args.index("--output-dir") + 1]
    assert output_dir.startswith("/workspace/train/resnet18-")
    assert output_dir.endswith("/abc123")
    volumes = {v["name"]: v for v in replicas["Worker"]["template"]["spec"]["volumes"]}
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in volumes.values()
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["kfp-ddp-workspace"]
    shm = [v for v in volumes.values() if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm[0]["emptyDir"]["sizeLimit"] == "8Gi"


def test_render_shows_object_store_staging_and_the_checkpoint_mirror() -> None:
    """The default storage: each node stages data_uri (checking the data step's digest) in an
    init container, writes on its own disk and mirrors to publish_uri/training."""
    digest = "0123456789abcdef" * 4
    result = CliRunner().invoke(
        main,
        [
            "render",
            *REQUIRED,
            *("-p", "api=pytorchjob", "-p", "s3_credentials_secret=team-s3"),
            *("-p", "s3_endpoint=https://minio.example.com", "--data-digest", digest),
        ],
    )
    assert result.exit_code == 0, result.output
    job = yaml_fast.safe_load(result.stdout)
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][init["command"].index("--source") + 1] == "s3://bucket/datasets/cats"
    assert init["command"][init["command"].index("--expect-digest") + 1] == digest
    args = pod["containers"][0]["args"]
    assert args[args.index("--data-dir") + 1] == "/stage/current"
    assert args[args.index("--output-dir") + 1].startswith("/stage/output/")
    mirror = args[args.index("--checkpoint-uri") + 1]
    assert mirror.startswith("s3://bucket/models/training/resnet18-")
    assert mirror.endswith(f"/{digest[:16]}/checkpoints")
    assert args[args.index("--output-uri") + 1] == mirror.replace("/checkpoints", "/output")
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    refs = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert refs["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "team-s3"
    assert refs["AWS_ENDPOINT_URL_S3"]["value"] == "https://minio.example.com"


def test_render_prints_the_trainjob_by_default() -> None:
    result = CliRunner().invoke(
        main,
        [
            "render",
            *REQUIRED,
            "-p",
            "workers=3",
            "-p",
            "gpus_per_worker=2",
            "-p",
            "nproc_per_node=2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "api=auto: a TrainJob" in result.stderr
    job = yaml_fast.safe_load(result.stdout)
    assert job["kind"] == "TrainJob"
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 2
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "2"
    assert trainer["args"][-2:] == ["--device", "cuda"]


def test_render_refuses_bad_values_clearly() -> None:
    bad_override = CliRunner().invoke(
        main, ["render", *REQUIRED, "-p", 'overrides_json={"bogus": 1}']
    )
    assert bad_override.exit_code == 2
    assert "-p overrides_json=" in bad_override.output and "bogus" in bad_override.output
    assert "Traceback" not in bad_override.output
    bad_type = CliRunner().invoke(main, ["render", *REQUIRED, "-p", "workers=two"])
    assert bad_type.exit_code == 2
    assert "'workers' expects an integer" in bad_type.output


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        (["-p", "workers=0"], "-p workers=0: TrainSpec.workers=0 is invalid"),
        (["-p", "epochs=0"], "-p epochs=0: --epochs 0 is too small"),
        (["-p", "lr=-1"], "-p lr=-1.0: --lr -1.0 is out of range"),
        (["-p", "model=not_a_model"], "-p model='not_a_model': --model 'not_a_model' is not"),
        (["-p", "accuracy_threshold=2"], "-p accuracy_threshold=2.0: must be between 0 and 1"),
        (["-p", "data_uri=not-a-uri"], "-p data_uri='not-a-uri': must be an s3://bucket/prefix"),
        (["-p", "publish_uri=s3://bucket/datasets/cats/models"], "lies inside data_uri"),
        (["-p", 'trainer_args=["--epochs", "99"]'], "--epochs is the pipeline parameter epochs"),
        (["-p", 'trainer_args=["--data-dir=/x"]'], "--data-dir is set by the pipeline"),
        (["-p", 'trainer_args=["--bogus"]'], "No such option '--bogus'"),
        (
            ["-p", "api=trainjob", "-p", 'overrides_json={"scheduler_name": "volcano"}'],
            "podGroupPolicy",
        ),
    ],
)
def test_every_bad_argument_is_one_line_naming_the_parameter(params, needle) -> None:
    """Refused before anything runs, in render, run, schedule and run-local alike."""
    given = {p.split("=", 1)[0] for p in params if p != "-p"}
    required = [
        x
        for pair in zip(REQUIRED[::2], REQUIRED[1::2], strict=True)
        for x in pair
        if pair[1].split("=", 1)[0] not in given
    ]
    for command in (["render"], ["run-local", "--workspace", "/nonexistent/never-made"]):
        result = CliRunner().invoke(main, [*command, *required, *params])
        assert result.exit_code == 2, result.output
        assert needle in result.output, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize("key", ["backend", "workspace_path"])
def test_internal_knobs_are_no_parameters(key: str, tmp_path) -> None:
    result = CliRunner().invoke(main, ["run-local", "--workspace", str(tmp_path), "-p", f"{key}=x"])
    assert result.exit_code == 2
    assert f"unknown pipeline parameter {key!r}" in result.output
    assert not any(tmp_path.iterdir())


def test_version() -> None:
    from kfp_ddp import __version__

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("compile", "run-local", "upload", "run", "schedule", "render"):
        assert command in result.output


@pytest.mark.parametrize(
    ("classes", "needle"),
    [
        ((), "has no train/ folder (it has nothing): the pipeline needs {folder}/train/<class>/*"),
        (("cat",), "train/ has 1 class ['cat']"),
    ],
    ids=["empty", "one-class"],
)
def test_a_data_folder_the_data_step_would_refuse_is_refused_first(tmp_path, classes, needle):
    """With the data step's own rules, naming --data and the folder, before a server starts or
    anything is written."""
    folder = tmp_path / "photos"
    if classes:
        write_image_folder(folder, classes=classes, per_class=2, val_per_class=1)
    else:
        folder.mkdir()
    workspace = tmp_path / "ws"
    result = CliRunner().invoke(
        main, ["run-local", "--workspace", str(workspace), "--data", str(folder), *REQUIRED[2:]]
    )
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--data': {folder}: " in result.output, result.output
    assert needle.format(folder=folder) in result.output, result.output
    assert not workspace.exists()
