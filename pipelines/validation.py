"""Check every pipeline argument before anything runs: one line per problem, naming the
parameter, the value and the fix.

``check_arguments(arguments)`` is called by ``kfp-ddp run/schedule/run-local/render`` before they
submit, and by the pipeline's first step (``pipelines.steps.check_arguments_step``), so a run
started from the Kubeflow UI fails in seconds instead of after a data sync and three attempts of
a GPU job. It reuses the checks of the parts themselves — the launcher's ``TrainSpec`` (through
the training step's own ``training_spec``) and the trainer's flags (``trainer.train.check_flags``)
— and maps their errors back to the pipeline parameter that set the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

FLAG_PARAMETER = {
    "--model": "model",
    "--epochs": "epochs",
    "--batch-size": "batch_size",
    "--lr": "lr",
    "--image-size": "image_size",
    "--checkpoint-every-steps": "checkpoint_interval",
}
"""Trainer flags the pipeline sets from its own parameters (refused in trainer_args)."""
SET_BY_PIPELINE = {
    "--data-dir": "the pipeline syncs data_uri there",
    "--output-dir": "the pipeline names it after the settings and the data",
    "--checkpoint-dir": "checkpoints live in the run's output folder",
    "--checkpoint-uri": "set the pipeline parameter checkpoint_uri instead",
    "--output-uri": "the pipeline uploads the model under checkpoint_uri",
    "--device": "gpus_per_worker decides it (cuda with GPUs, else cpu)",
    "--metrics-port": "set the pipeline parameter metrics_port instead",
    "--metrics-job": "the launcher sets it to the job's name (with metrics_port)",
}
SPEC_PARAMETER = {
    "workers": "workers",
    "gpus_per_worker": "gpus_per_worker",
    "nproc_per_node": "nproc_per_node",
    "namespace": "namespace",
    "image": "image",
    "cpu_request": "cpu_per_worker",
    "memory_request": "memory_per_worker",
    "api": "job_api",
    "metrics_port": "metrics_port",
}
"""TrainSpec fields set from pipeline parameters; any other field comes from train_overrides."""
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ArgumentError(ValueError):
    """One or more pipeline arguments are wrong; ``problems`` has one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def check_arguments(arguments: Mapping[str, Any]) -> None:
    """Raise ArgumentError listing every problem of ``arguments`` (the pipeline's, all given)."""
    from pipelines.late_checks import configuration_problems

    problems: list[str] = []
    for check in (_uris, _names, _gate, _trainer_args, _training_job):
        problems += check(arguments)
    problems += [str(error) for error in configuration_problems(arguments)]
    if problems:
        raise ArgumentError(problems)


def _problem(parameter: str, value: Any, why: str) -> str:
    return f"{parameter}={value!r}: {why}"


def _s3_problem(parameter: str, value: Any, example: str) -> str | None:
    from components.s3_sync.s3_uri import parse_s3_uri

    if not isinstance(value, str) or not value.startswith("s3://"):
        return _problem(parameter, value, f"must be an s3://bucket/prefix URI, e.g. {example}")
    try:
        location = parse_s3_uri(value, name=parameter)
    except ValueError as exc:
        return f"{exc}; e.g. {example}"
    if not location.prefix.strip("/"):
        return _problem(parameter, value, f"give a prefix inside the bucket, e.g. {example}")
    return None


def _uris(a: Mapping[str, Any]) -> list[str]:
    problems = [
        p
        for p in (
            _s3_problem("data_uri", a.get("data_uri"), "s3://my-bucket/datasets/cats"),
            _s3_problem("publish_uri", a.get("publish_uri"), "s3://my-bucket/models/cats"),
            a.get("checkpoint_uri")
            and _s3_problem(
                "checkpoint_uri", a.get("checkpoint_uri"), "s3://my-bucket/checkpoints/cats"
            ),
        )
        if p
    ]
    if not problems:
        problems += _inside_the_data(a)
    baseline = a.get("baseline_uri", "")
    if baseline and str(baseline).startswith("s3:") and not str(baseline).startswith("s3://"):
        problems.append(_problem("baseline_uri", baseline, "write s3://bucket/key or ''"))
    if a.get("storage") not in (None, "object-store", "shared-volume"):
        problems.append(_problem("storage", a.get("storage"), "object-store or shared-volume"))
    return problems


def _inside_the_data(a: Mapping[str, Any]) -> list[str]:
    """Outputs written under data_uri would be synced as training data by the next run."""
    data = str(a.get("data_uri", "")).rstrip("/") + "/"
    problems = []
    for parameter, what in (("publish_uri", "models"), ("checkpoint_uri", "checkpoints")):
        value = str(a.get(parameter) or "")
        if value.rstrip("/").startswith(data):
            problems.append(
                _problem(
                    parameter,
                    value,
                    f"lies inside data_uri={a.get('data_uri')!r}: {what} would be synced as "
                    "training data next run; keep them elsewhere",
                )
            )
    return problems


def _names(a: Mapping[str, Any]) -> list[str]:
    problems = []
    for parameter in ("credentials_secret", "workspace_pvc"):
        value = a.get(parameter)
        if value is not None and (not isinstance(value, str) or not DNS1123.match(value)):
            problems.append(
                _problem(parameter, value, "must be a Kubernetes object name such as s3-creds")
            )
    return problems


def _gate(a: Mapping[str, Any]) -> list[str]:
    problems = []
    for parameter, low, high, fix in (
        ("accuracy_threshold", 0.0, 1.0, "a fraction such as 0.9 (90% accuracy)"),
        ("tolerance", 0.0, 1.0, "a fraction such as 0.01 (one point of accuracy)"),
    ):
        value = a.get(parameter)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            problems.append(
                _problem(parameter, value, f"must be between {low:g} and {high:g}: {fix}")
            )
    return problems


def _trainer_args(a: Mapping[str, Any]) -> list[str]:
    args = a.get("trainer_args") or []
    if not isinstance(args, list) or not all(isinstance(x, str) for x in args):
        return [
            _problem("trainer_args", args, 'must be a list of strings, e.g. ["--augment", "none"]')
        ]
    problems = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in FLAG_PARAMETER:
            problems.append(
                _problem(
                    "trainer_args",
                    args,
                    f"{flag} is the pipeline parameter "
                    f"{FLAG_PARAMETER[flag]}; set -p {FLAG_PARAMETER[flag]}=... instead",
                )
            )
        elif flag in SET_BY_PIPELINE:
            problems.append(
                _problem(
                    "trainer_args",
                    args,
                    f"{flag} is set by the pipeline ({SET_BY_PIPELINE[flag]}); leave it out",
                )
            )
    return problems


def _training_job(a: Mapping[str, Any]) -> list[str]:
    """The launcher's and the trainer's own checks on what the training step would run."""
    from components.launcher import SpecError
    from components.launcher.step import (
        StepOverrides,
        TrainingStepInputs,
        trainer_args_for,
        training_spec,
    )
    from pipelines.training import planned_step_inputs

    try:
        inputs = TrainingStepInputs(**planned_step_inputs(a, "DIGEST"))
        custom_command = StepOverrides.parse(inputs.overrides_json).spec_fields.get("command")
    except SpecError as exc:
        return [_spec_problem(str(exc), a)]
    except (TypeError, ValueError) as exc:
        return [f"the training step's inputs: {exc}"]
    problems = []
    try:
        spec = training_spec(inputs, run_id="check")
        if spec.api == "auto":  # both would have to refuse it for it to fail everywhere
            _bound_to_either(spec)
    except SpecError as exc:
        problems.append(_spec_problem(str(exc), a))
    if custom_command is None:  # our trainer (another program's flags are its own)
        problems += _trainer_flag_problems(trainer_args_for(inputs), a)
    return problems


def _trainer_flag_problems(args: list[str], a: Mapping[str, Any]) -> list[str]:
    """The trainer's own check: each parameter's flag alone (to name every bad one), then all."""
    from trainer.errors import ConfigError
    from trainer.train import check_flags

    problems = []
    for flag, parameter in FLAG_PARAMETER.items():
        if parameter not in a:
            continue
        try:  # the parameter's own value: 0 and "" are values here, not "the trainer's default"
            check_flags([flag, str(a[parameter])])
        except ConfigError as exc:
            problems.append(_trainer_problem(str(exc), a))
    if problems:
        return problems
    try:
        check_flags(args)
    except ConfigError as exc:
        return [_trainer_problem(str(exc), a)]
    return []


def _bound_to_either(spec: Any) -> None:
    from components.launcher import SpecError

    errors = []
    for api in ("trainjob", "pytorchjob"):
        try:
            spec.for_api(api)
            return
        except SpecError as exc:
            errors.append(exc)
    raise errors[0]


def _spec_problem(message: str, a: Mapping[str, Any]) -> str:
    found = re.match(r"(?:TrainSpec\.)?(\w+)[=:]", message)
    field = found.group(1) if found else ""
    parameter = SPEC_PARAMETER.get(field)
    if parameter is None:
        return f"train_overrides={a.get('train_overrides')!r}: {message}"
    return f"{parameter}={a.get(parameter)!r}: {message}"


def _trainer_problem(message: str, a: Mapping[str, Any]) -> str:
    found = re.match(r"(--[a-z0-9-]+)", message)
    parameter = FLAG_PARAMETER.get(found.group(1)) if found else None
    if parameter is not None:
        return f"{parameter}={a.get(parameter)!r}: {message}"
    return f"trainer_args={a.get('trainer_args')!r}: {message}"
