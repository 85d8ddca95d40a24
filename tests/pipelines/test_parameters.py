"""The pipeline's parameters declared once (``pipelines.parameters``), and errors that name the
parameter the user set, and only it (issue 22: what a new user hit)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.validation import ArgumentError, check_arguments

REQUIRED = ["-p", "data_uri=s3://my-bucket/datasets/cats", "-p", "publish_uri=s3://my-bucket/m"]


def problems_of(**given: object) -> list:
    """The ParameterErrors of the object-store pipeline's arguments with ``given`` set."""
    from pipelines.cli_arguments import with_defaults

    arguments = with_defaults(
        {"data_uri": "s3://my-bucket/datasets/cats", "publish_uri": "s3://my-bucket/m"} | given
    ) | {"backend": "kubernetes", "workspace_path": "/workspace", "storage": "object-store"}
    arguments |= {"cluster_settings": ""}
    with pytest.raises(ArgumentError) as err:
        check_arguments(arguments)
    return err.value.errors


@pytest.mark.parametrize(
    ("given", "parameter"),
    [
        ({"publish_uri": "s3://My_Models/cats"}, "publish_uri"),
        ({"s3_endpoint": "minio.example.com:9000"}, "s3_endpoint"),
        ({"data_uri": "not-a-uri"}, "data_uri"),
        ({"checkpoint_uri": "s3://b/checkpoints"}, "checkpoint_uri"),
        ({"workers": 0}, "workers"),
        ({"cpu_request": "lots"}, "cpu_request"),
        ({"epochs": 0}, "epochs"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
    ],
)
def test_an_error_names_the_parameter_the_user_set_and_only_it(given, parameter):
    errors = problems_of(**given)
    assert [error.field for error in errors] == [parameter]
    assert str(errors[0]).startswith(f"{parameter}={given[parameter]!r}: ")


@pytest.mark.parametrize("bucket", ["b", "My_Bucket", "my-bucket/data "])
@pytest.mark.parametrize("parameter", ["data_uri", "publish_uri", "checkpoint_uri"])
def test_a_bad_bucket_is_refused_alike_by_every_s3_parameter(parameter, bucket):
    uri = f"s3://{bucket}" if bucket.endswith(" ") else f"s3://{bucket}/prefix"
    errors = problems_of(**{parameter: uri})
    assert [error.field for error in errors] == [parameter]


@pytest.mark.parametrize("uri", ["s3://b/prefix", "s3://My_Bucket/prefix", "s3://my-bucket/x "])
def test_every_part_refuses_the_same_bad_uri(uri, tmp_path):
    """The one parser: the sync, the launcher's step and spec, and the trainer's flags."""
    from components.launcher import SpecError, TrainSpec
    from components.launcher.step import TrainingStepInputs
    from components.s3_sync.errors import S3SyncUsageError
    from components.s3_sync.s3_uri import parse_s3_uri
    from trainer.errors import ConfigError
    from trainer.flags import check_flags

    with pytest.raises(S3SyncUsageError):
        parse_s3_uri(uri)
    with pytest.raises(SpecError) as step_error:
        TrainingStepInputs(data_uri=uri, checkpoint_uri="s3://my-bucket/c").check_storage()
    assert step_error.value.field == "data_uri"
    with pytest.raises(SpecError):
        TrainSpec(name="j", stage_data_uri=uri)
    with pytest.raises(ConfigError):
        check_flags(["--checkpoint-uri", uri])


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"workers": 3}, "the pipeline parameter workers"),
        ({"cpu_request": "8"}, "the pipeline parameter cpu_request"),
        ({"image": "mine:1"}, "the pipeline parameter image"),
        ({"args": ["--output-dir", "/x"]}, "would replace the trainer's own arguments"),
        ({"task_name": "other"}, "'task_name' is set by the pipeline"),
        ({"stage_data_uri": "s3://b/p"}, "'stage_data_uri' is set by the pipeline"),
    ],
)
def test_train_overrides_takes_no_setting_of_a_parameter(overrides, named):
    errors = problems_of(overrides_json=json.dumps(overrides))
    assert [error.field for error in errors] == ["overrides_json"]
    assert named in errors[0].fix


def test_train_overrides_of_other_settings_pass_the_same_checks():
    """A setting no parameter has is taken, and checked as the launcher checks it."""
    errors = problems_of(overrides_json='{"shm_size": "lots"}')
    assert [error.field for error in errors] == ["overrides_json"]
    assert "shm_size" in str(errors[0])


def test_the_listing_shows_every_declared_parameter():
    from pipelines.parameters import declared

    result = CliRunner().invoke(main, ["parameters"])
    assert result.exit_code == 0, result.output
    for parameter in declared("object-store"):
        assert f"{parameter.name} ({parameter.type.__name__}, " in result.output
    assert "workspace_pvc" not in result.output  # shared-volume only
    shared = CliRunner().invoke(main, ["parameters", "--storage", "shared-volume"])
    assert "workspace_pvc (str, default 'kfp-ddp-workspace')" in shared.output


def test_the_pipeline_declares_the_declared_parameters():
    """KFP reads the generated signature and docstring: types, defaults and docs."""
    from pipelines.cli_arguments import pipeline_inputs

    inputs = pipeline_inputs("object-store")
    assert inputs["label_smoothing"]["parameterType"] == "NUMBER_DOUBLE"
    assert inputs["label_smoothing"]["defaultValue"] == 0.0
    assert "Label smoothing" in inputs["label_smoothing"]["description"]  # the trainer's doc
    assert "defaultValue" not in inputs["data_uri"]


def test_label_smoothing_reaches_the_trainer():
    result = CliRunner().invoke(main, ["render", *REQUIRED, "-p", "label_smoothing=0.1"])
    assert result.exit_code == 0, result.output
    assert "--label-smoothing" in result.output and "'0.1'" in result.output


def test_label_smoothing_changes_the_run_folder_only_when_set():
    """A new setting of what is trained gets its own folder; unset, the folders stay as they
    were (runs started before it existed resume their own checkpoints)."""
    import dataclasses

    from components.launcher.step import TrainingStepInputs, run_key, trainer_args_for

    base = TrainingStepInputs(data_dir="/d", output_dir="/o")
    smoothed = dataclasses.replace(base, label_smoothing=0.1)
    assert run_key(base) != run_key(smoothed)
    assert "--label-smoothing" not in trainer_args_for(base)
    assert trainer_args_for(smoothed)[-2:] == ["--label-smoothing", "0.1"]


DATA = "s3://my-bucket/datasets/cats"


@pytest.mark.parametrize(
    ("given", "parameter", "words"),
    [
        ({"publish_uri": DATA}, "publish_uri", f"is data_uri={DATA!r} itself"),
        ({"publish_uri": f"{DATA}/"}, "publish_uri", f"is data_uri={DATA!r} itself"),
        ({"publish_uri": f"{DATA}/models"}, "publish_uri", f"lies inside data_uri={DATA!r}"),
        ({"publish_uri": "s3://my-bucket/datasets"}, "publish_uri", f"holds data_uri={DATA!r}"),
        ({"checkpoint_uri": DATA}, "checkpoint_uri", f"is data_uri={DATA!r} itself"),
        ({"checkpoint_uri": f"{DATA}/ckpt"}, "checkpoint_uri", "lies inside data_uri"),
        ({"checkpoint_uri": "s3://my-bucket/datasets"}, "checkpoint_uri", "holds data_uri"),
        (
            {"checkpoint_uri": "s3://my-bucket/m"},
            "publish_uri",
            "is checkpoint_uri='s3://my-bucket/m' itself",
        ),
        (
            {"publish_uri": "s3://my-bucket/ckpt/models", "checkpoint_uri": "s3://my-bucket/ckpt"},
            "publish_uri",
            "lies inside checkpoint_uri='s3://my-bucket/ckpt'",
        ),
    ],
)
def test_data_models_and_checkpoints_each_have_a_place_of_their_own(given, parameter, words):
    """Equal or nested either way is refused, naming both parameters and their values."""
    errors = problems_of(**given)
    assert [error.field for error in errors] == [parameter]
    assert words in str(errors[0])


@pytest.mark.parametrize(
    "given",
    [
        {"publish_uri": "s3://my-bucket/datasets/cats2"},  # a sibling sharing the name's start
        {"publish_uri": "s3://other-bucket/datasets/cats"},
        {"checkpoint_uri": "s3://my-bucket/m/training"},  # inside publish_uri, as by default
    ],
)
def test_places_apart_pass(given):
    from pipelines.cli_arguments import with_defaults

    arguments = with_defaults({"data_uri": DATA, "publish_uri": "s3://my-bucket/m"} | given)
    arguments |= {"backend": "kubernetes", "workspace_path": "/workspace"}
    arguments |= {"storage": "object-store", "cluster_settings": ""}
    check_arguments(arguments)


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("Registry.Example.com/Team/KFP-DDP:V1", "repository paths are lowercase"),
        ("ghcr.io/team/kfp-ddp:-v1", "is not a tag"),
    ],
)
def test_an_image_a_runtime_would_refuse_is_refused_by_name(image, words):
    errors = problems_of(image=image)
    assert [error.field for error in errors] == ["image"]
    assert words in str(errors[0])


@pytest.mark.parametrize(
    ("value", "flag"), [("true", "--skip-bad-images"), ("false", "--no-skip-bad-images")]
)
def test_a_switch_reaches_the_trainer_as_a_switch(value, flag):
    result = CliRunner().invoke(main, ["render", *REQUIRED, "-p", f"skip_bad_images={value}"])
    assert result.exit_code == 0, result.output
    assert flag in result.output


def test_a_switch_left_alone_is_the_trainers_default():
    result = CliRunner().invoke(main, ["render", *REQUIRED])
    assert result.exit_code == 0, result.output
    assert "--no-skip-bad-images" in result.output
