"""Checks that used to wait for a late step, now in the run's first step (and the CLI before it
submits): backend_options typos, GPUs the local backend does not have, a baseline_uri that
names nothing (against the test S3 server, read the way the evaluation reads it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.cli_arguments import with_defaults
from pipelines.generated_check_step import check_arguments_step
from pipelines.late_checks import local_gpus
from pipelines.validation import ArgumentError, check_arguments

REQUIRED = ["-p", "data_uri=s3://bucket/datasets/cats", "-p", "publish_uri=s3://bucket/models"]


def arguments(backend: str = "kubernetes", **given) -> dict:
    """Every parameter of the check step: the pipeline's defaults, ``given``, compile time."""
    return with_defaults(
        {"data_uri": "s3://bucket/datasets/cats", "publish_uri": "s3://bucket/models"} | given,
        "shared-volume",
    ) | {
        "backend": backend,
        "workspace_path": "/workspace",
        "storage": "shared-volume",
        "cluster_settings": "",
    }


def problems(values: dict) -> list[str]:
    with pytest.raises(ArgumentError) as refused:
        check_arguments(values)
    return refused.value.problems


# -- backend_options -----------------------------------------------------------------------------


def test_a_backend_options_typo_is_refused_naming_the_key_and_the_nearest_one():
    overrides = json.dumps({"shm_size": "8Gi", "backend_options": {"timout_s": 600}})
    (problem,) = problems(arguments(overrides_json=overrides))
    assert problem.startswith(f"overrides_json={overrides!r}: backend_options: ")
    assert "unknown option(s) ['timout_s'] for the kubernetes backend" in problem
    assert "(did you mean 'timeout_s'?)" in problem
    # The other backend has other options: a kubernetes one is no local one.
    local = json.dumps({"backend_options": {"cleanup": "never"}})
    (problem,) = problems(arguments("local", gpus_per_worker=0, overrides_json=local))
    assert "unknown option(s) ['cleanup'] for the local backend" in problem
    assert "valid: path_map, workdir" in problem
    # Right keys pass; a bad value is the backend's to name, now rather than after the data.
    check_arguments(arguments(overrides_json='{"backend_options": {"timeout_s": 60}}'))
    bad_value = json.dumps({"backend_options": {"cleanup": "sometimes"}})
    (problem,) = problems(arguments(overrides_json=bad_value))
    assert "backend_options.cleanup='sometimes' is not allowed" in problem


def test_the_cli_refuses_a_backend_options_typo_before_submitting():
    result = CliRunner().invoke(
        main,
        ["render", *REQUIRED, "-p", 'overrides_json={"backend_options": {"clean_up": "never"}}'],
    )
    assert result.exit_code == 2, result.output
    assert "-p overrides_json=" in result.output
    assert "['clean_up'] for the kubernetes backend (did you mean 'cleanup'?)" in result.output


# -- GPUs of the local backend -------------------------------------------------------------------


def test_gpus_the_local_backend_does_not_have_are_refused():
    more = local_gpus()[0] + 1  # one more than this machine has, with or without GPUs
    (problem,) = problems(arguments("local", gpus_per_worker=more))
    assert problem.startswith(f"gpus_per_worker={more}: the local backend runs every node on")
    assert "set gpus_per_worker=0 to train on the CPU (gloo)" in problem
    # A cluster has its own GPUs; CPUs are always there.
    check_arguments(arguments("kubernetes", gpus_per_worker=more))
    check_arguments(arguments("local", gpus_per_worker=0))


def test_run_local_refuses_them_before_anything_runs(tmp_path: Path):
    more = local_gpus()[0] + 1
    result = CliRunner().invoke(
        main,
        ["run-local", "--workspace", str(tmp_path / "ws"), *REQUIRED]
        + ["-p", f"gpus_per_worker={more}"],
    )
    assert result.exit_code == 2, result.output
    assert f"-p gpus_per_worker={more}: the local backend runs every node" in result.output
    assert not (tmp_path / "ws" / "logs").exists()  # no pipeline started


# -- the model's image size, in the check step ----------------------------------------------------


def test_an_image_size_the_model_cannot_take_fails_the_check_step(capfd):
    """alexnet's layers leave nothing of 32 px images: refused before any node starts, naming
    the parameter and the smallest size alexnet takes (measured on the meta device)."""
    values = arguments(model="alexnet", image_size=32)
    with pytest.raises(SystemExit) as failed:
        check_arguments_step(**values)
    assert str(failed.value).startswith("1 bad pipeline argument(s): image_size=32: ")
    out = capfd.readouterr().out
    assert "bad argument: image_size=32: --image-size 32 does not fit --model alexnet" in out
    assert "use --image-size 63 or more" in out
    # A ViT takes exactly the size it is built for.
    with pytest.raises(SystemExit, match=r"image_size=128: .*use --image-size 224, the size"):
        check_arguments_step(**arguments(model="vit_b_16", image_size=128))
    check_arguments_step(**arguments(model="alexnet", image_size=64))  # returns


def test_a_batch_of_one_that_batchnorm_refuses_fails_the_check_step_naming_batch_size():
    with pytest.raises(SystemExit, match=r"batch_size=1: --batch-size 1 does not fit --model "):
        check_arguments_step(**arguments(model="resnet18", image_size=32, batch_size=1))
    check_arguments_step(**arguments(model="resnet18", image_size=224, batch_size=1))  # returns


def test_the_cli_refuses_an_image_size_the_model_cannot_take_before_submitting():
    args = ["render", *REQUIRED, "-p", "model=alexnet", "-p", "image_size=32"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "-p image_size=32: --image-size 32 does not fit --model alexnet" in result.output


# -- baseline_uri, in the check step --------------------------------------------------------------


def test_a_missing_baseline_fails_the_check_step(s3, capfd):
    bucket = s3.create_bucket("baselines")
    missing = f"s3://{bucket}/models/run-1/eval.json"
    values = arguments(baseline_uri=missing, s3_endpoint=s3.endpoint_url)
    with pytest.raises(SystemExit) as failed:
        check_arguments_step(**values)
    assert str(failed.value).startswith(f"1 bad pipeline argument(s): baseline_uri={missing!r}: ")
    out = capfd.readouterr().out
    assert f"bad argument: baseline_uri={missing!r}: could not be read (NoSuchKey)" in out
    assert "or pass '' for no baseline (the evaluation gate compares" in out


def test_a_baseline_that_the_evaluation_can_use_passes(s3):
    bucket = s3.create_bucket("baselines")
    s3.client().put_object(Bucket=bucket, Key="m/eval.json", Body=b'{"accuracy": 0.9}')
    s3.client().put_object(Bucket=bucket, Key="m/other.json", Body=b'{"loss": 0.1}')
    good = arguments(baseline_uri=f"s3://{bucket}/m/eval.json", s3_endpoint=s3.endpoint_url)
    check_arguments_step(**good)  # returns, no SystemExit
    # An object without an accuracy is no baseline: the same words as the evaluation's.
    bad = good | {"baseline_uri": f"s3://{bucket}/m/other.json"}
    with pytest.raises(SystemExit, match=r"baseline has no 'accuracy' \(or 'val_accuracy'\) key"):
        check_arguments_step(**bad)


def test_no_baseline_and_paths_the_check_step_cannot_see(tmp_path: Path):
    # '' is "no baseline": nothing to read, no S3 needed.
    check_arguments_step(**arguments(baseline_uri=""))
    # A path: on a cluster the evaluation reads its own volumes, which the check step does not
    # mount; locally every step shares this machine's files, so it is checked.
    path = str(tmp_path / "eval.json")
    check_arguments_step(**arguments(baseline_uri=path))
    local = arguments("local", gpus_per_worker=0, baseline_uri=path)
    with pytest.raises(SystemExit, match=f"baseline_uri={path!r}: no such file"):
        check_arguments_step(**local)
    Path(path).write_text('{"accuracy": 0.5}')
    check_arguments_step(**local)


@pytest.mark.parametrize(
    ("api", "overrides", "says"),
    [
        ("trainjob", {"runtime_name": "deepspeed-distributed"}, "Kubeflow Trainer's own MPI"),
        ("auto", {"runtime_name": "mlx-distributed"}, "Kubeflow Trainer's own MPI"),
        ("trainjob", {"runtime_name": "xgboost-distributed"}, "it is an XGBoost runtime"),
        ("pytorchjob", {"ml_policy": "mpi"}, "an mlPolicy (MPI, XGBoost...) is a Kubeflow"),
    ],
)
def test_our_trainer_on_an_mpi_or_xgboost_runtime_is_refused_in_the_first_step(
    api, overrides, says
):
    found = problems(arguments(api=api, overrides_json=json.dumps(overrides)))
    assert len(found) == 1 and found[0].startswith("overrides_json=") and says in found[0]
