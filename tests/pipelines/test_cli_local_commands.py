"""`kfp-ddp render`, parameter parsing and `run-local` argument checks (no server, no cluster)."""

from __future__ import annotations

import click
import pytest
import yaml
from click.testing import CliRunner

from pipelines.cli import kfp_cron, main, parse_parameters

INPUTS = {
    "epochs": {"parameterType": "NUMBER_INTEGER", "defaultValue": 10.0, "isOptional": True},
    "lr": {"parameterType": "NUMBER_DOUBLE", "defaultValue": 0.1, "isOptional": True},
    "flag": {"parameterType": "BOOLEAN", "defaultValue": False, "isOptional": True},
    "tags": {"parameterType": "LIST", "defaultValue": [], "isOptional": True},
    "conf": {"parameterType": "STRUCT", "defaultValue": {}, "isOptional": True},
    "name": {"parameterType": "STRING"},
}


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
            'train_overrides={"shm_size": "8Gi", "backend_options": {"timeout_s": 60}}',
        ],
    )
    assert result.exit_code == 0, result.output
    job = yaml.safe_load(result.output)
    assert job["kind"] == "PyTorchJob"
    assert job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"]["kfp-ddp.io/run-id"] == "3f2b1c4d-0000-4000-8000-000000000001"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas["Worker"]["replicas"] == 2
    container = replicas["Master"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (2, "2")
    args = container["args"]
    assert args[args.index("--epochs") + 1] == "4"
    assert args[args.index("--data-dir") + 1] == "/workspace/data"
    output_dir = args[args.index("--output-dir") + 1]
    assert output_dir.startswith("/workspace/train/resnet18-")
    assert output_dir.endswith("/abc123")
    volumes = {v["name"]: v for v in replicas["Master"]["template"]["spec"]["volumes"]}
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in volumes.values()
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["kfp-ddp-workspace"]
    shm = [v for v in volumes.values() if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm[0]["emptyDir"]["sizeLimit"] == "8Gi"


def test_render_refuses_bad_values_clearly() -> None:
    bad_override = CliRunner().invoke(main, ["render", "-p", 'train_overrides={"bogus": 1}'])
    assert bad_override.exit_code == 1
    assert "bogus" in bad_override.output
    assert "Traceback" not in bad_override.output
    bad_type = CliRunner().invoke(main, ["render", "-p", "workers=two"])
    assert bad_type.exit_code == 2
    assert "'workers' expects an integer" in bad_type.output


@pytest.mark.parametrize("key", ["backend", "workspace_path"])
def test_run_local_sets_backend_and_workspace_itself(key: str, tmp_path) -> None:
    result = CliRunner().invoke(main, ["run-local", "--workspace", str(tmp_path), "-p", f"{key}=x"])
    assert result.exit_code == 2
    assert "run-local sets" in result.output
    assert not any(tmp_path.iterdir())


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("compile", "run-local", "upload", "run", "schedule", "render"):
        assert command in result.output
