"""One name and one default per setting, from the Kubeflow UI to the trainer.

Every trainer setting of the training step is walked through every layer: the pipeline parameter,
the step's input, the component's signature, the trainer flag and the trainer's config. Then one
is added the way ARCHITECTURE.md says (one declaration), to prove the recipe.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass

import pytest
from kfp import compiler

from components.kfp.launcher import (
    make_training_job_op,
    training_job_function,
    training_job_source,
)
from components.launcher.step import (
    TRAINER_SETTING,
    TrainingStepInputs,
    run_key,
    trainer_args_for,
    trainer_flag_inputs,
    trainer_setting,
)
from pipelines.parameters import (
    PARAMETERS,
    RENAMED_PARAMETERS,
    step_parameters,
    trainer_parameters,
)
from tests.generated_modules import import_written
from trainer import config as trainer_config
from trainer.flags import check_flags

SETTINGS = [f for f in dataclasses.fields(TrainingStepInputs) if TRAINER_SETTING in f.metadata]
BASE = {"data_uri": "s3://data/set", "checkpoint_uri": "s3://bucket/ckpt", "data_digest": "d1"}


def test_the_step_declares_the_trainer_settings_the_pipeline_offers():
    assert [f.name for f in SETTINGS] == [
        "model_name",  # not "model": the component's output artifact has that name
        "init_from",
        "epochs",
        "batch_size",
        "lr",
        "image_size",
        "checkpoint_every_steps",
        "label_smoothing",
        "skip_bad_images",
    ]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda f: f.name)
def test_a_setting_has_one_name_in_every_layer(setting):
    name = setting.metadata[TRAINER_SETTING]  # the trainer's config field
    assert setting.name == name or (setting.name, name) == ("model_name", "model")
    assert trainer_flag_inputs()[setting.name] == "--" + name.replace("_", "-")  # its flag
    assert step_parameters()[setting.name] == name  # the pipeline parameter that sets the input
    (parameter,) = [p for p in PARAMETERS if p.name == name]
    hint = typing.get_type_hints(trainer_config.TrainConfig)[name]
    assert parameter.type in (hint, *typing.get_args(hint))
    signature = inspect.signature(training_job_function(image="img")).parameters
    # The component: None leaves the trainer's default; KFP has no None for an integer input,
    # so an integer's default is the trainer's own.
    expected = trainer_config.field_defaults()[name] if parameter.type is int else None
    assert signature[setting.name].default == expected
    assert getattr(TrainingStepInputs(), setting.name) is None


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda f: f.name)
def test_a_setting_has_one_default_or_the_pipeline_says_why_it_has_another(setting):
    name = setting.metadata[TRAINER_SETTING]
    (parameter,) = [p for p in PARAMETERS if p.name == name]
    trainer_default = trainer_config.field_defaults()[name]
    if "pipeline_default" in setting.metadata:
        assert parameter.default == setting.metadata["pipeline_default"] != trainer_default
        assert setting.metadata["why"] in parameter.doc
    else:
        assert parameter.default == trainer_default
    assert trainer_config.field_docs()[name] in parameter.doc


@pytest.mark.parametrize(
    ("name", "value", "flag"),
    [
        ("checkpoint_every_steps", 0, ["--checkpoint-every-steps", "0"]),  # 0: end and SIGTERM only
        ("label_smoothing", 0.0, ["--label-smoothing", "0.0"]),
        ("epochs", 3, ["--epochs", "3"]),
    ],
)
def test_zero_is_a_value_that_reaches_the_trainer_and_none_is_not_set(name, value, flag):
    args = trainer_args_for(TrainingStepInputs(**BASE, **{name: value}))
    at = args.index(flag[0])
    assert args[at : at + 2] == flag
    assert getattr(check_flags(args[4:]), name) == value  # the trainer takes it as given
    unset = trainer_args_for(TrainingStepInputs(**BASE))
    assert flag[0] not in unset


def test_the_old_parameter_names_map_to_parameters_that_exist():
    names = {p.name for p in PARAMETERS}
    assert set(RENAMED_PARAMETERS.values()) <= names
    assert not set(RENAMED_PARAMETERS) & names


def test_a_setting_without_a_trainer_field_or_a_reason_is_refused():
    with pytest.raises(ValueError, match="TrainConfig has no field 'weight_decy'"):
        trainer_setting("weight_decy")
    with pytest.raises(ValueError, match="comes with its why"):
        trainer_setting("weight_decay", pipeline_default=0.01)
    with pytest.raises(ValueError, match="no None for an integer input"):
        trainer_setting("max_steps")


@dataclass(frozen=True, kw_only=True)
class WithWeightDecay(TrainingStepInputs):
    """The recipe of ARCHITECTURE.md: one declaration adds weight_decay to the step."""

    weight_decay: float | None = trainer_setting("weight_decay")


def test_adding_a_setting_is_one_declaration(tmp_path):
    (parameter,) = [p for p in trainer_parameters(WithWeightDecay) if p.name == "weight_decay"]
    assert parameter.type is float and parameter.default is None  # the optimizer decides
    assert parameter.doc == trainer_config.field_docs()["weight_decay"]
    inputs = WithWeightDecay(**BASE, weight_decay=0.0)
    args = trainer_args_for(inputs)
    assert args[args.index("--weight-decay") + 1] == "0.0"
    assert check_flags(args[4:]).weight_decay == 0.0
    # It changes what is trained: a run with it set trains in a folder of its own.
    assert run_key(inputs) != run_key(WithWeightDecay(**BASE))
    # The component written from the declaration takes it, optional, with the trainer's doc.
    path = tmp_path / "training_job.yaml"
    written = import_written(training_job_source(WithWeightDecay), tmp_path, "weight_decay_step")
    op = make_training_job_op(image="img", function=written.training_job_component)
    compiler.Compiler().compile(op, str(path))
    spec = op.component_spec.inputs["weight_decay"]
    assert spec.optional and spec.default is None and spec.type == "Float"
    assert "--weight-decay" in op.component_spec.inputs["weight_decay"].description
