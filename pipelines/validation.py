"""Check every pipeline argument before anything runs: one ``ParameterError`` per problem, each
naming the parameter the user set, its value and the fix.

``check_arguments(arguments)`` is called by ``kfp-ddp run/schedule/run-local/render`` before they
submit, and by the pipeline's first step (``pipelines.generated_check_step``), so a run
started from the Kubeflow UI fails in seconds instead of after a data sync and three attempts of
a GPU job. In order:

1. each parameter's own rule (``pipelines.parameters``);
2. what concerns two of them (the data, the models and the checkpoints in places apart), and
   ``overrides_json``: a JSON object of launcher settings that no parameter sets (a
   parameter's setting is refused naming it; the trainer's arguments are never replaced);
3. the parts' own checks on what the training step would run — the trainer's check of each
   parameter's flag alone, the launcher's ``TrainSpec``, and (when nothing else failed) the
   trainer's check of all its flags with trainer_args. Their errors carry the field they
   concern (``SpecError.field``, the flag checked), which the declarations turn into the
   parameter; a parameter already named is not named again;
4. the late checks (``pipelines.late_checks``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from components.launcher import SpecError
from components.launcher.step import (
    StepOverrides,
    TrainingStepInputs,
    flag_args,
    spec_field_input,
    trainer_args_for,
    trainer_flag_inputs,
    training_spec,
)
from kfp_ddp.s3_uri import S3Uri, S3UriError, parse_s3_uri
from pipelines.late_checks import configuration_problems
from pipelines.latest_model import LATEST
from pipelines.parameter_errors import ArgumentError, ParameterError
from pipelines.parameters import PARAMETERS, step_parameters
from pipelines.plan import planned_step_inputs
from pipelines.run_start import init_from_place_problem
from trainer.errors import ConfigError
from trainer.flags import check_flags

__all__ = ["ArgumentError", "ParameterError", "check_arguments"]

PIPELINE_VALUES = {"init_from": (LATEST,)}
"""Values of a trainer setting that only the pipeline knows: the check step resolves them."""


def check_arguments(arguments: Mapping[str, Any]) -> None:
    """Raise ArgumentError listing every problem of ``arguments`` (the pipeline's, all given),
    each parameter named once."""
    errors = list(_rules(arguments))
    named = {error.field for error in errors}
    errors += [e for e in _overlapping_places(arguments) if e.field not in named]
    place = init_from_place_problem(arguments.get("init_from"))
    if place:
        errors.append(ParameterError("init_from", arguments.get("init_from"), place))
    errors += _overrides(arguments)
    named = {error.field for error in errors}
    errors += [e for e in _trainer_flag_errors(arguments) if e.field not in named]
    named = {error.field for error in errors}
    errors += [e for e in _training_job(arguments, alone=bool(errors)) if e.field not in named]
    errors += configuration_problems(arguments)
    if errors:
        raise ArgumentError(errors)


def _rules(a: Mapping[str, Any]) -> Iterator[ParameterError]:

    for parameter in PARAMETERS:
        if parameter.rule is None or parameter.name not in a:
            continue
        fix = parameter.rule(a[parameter.name])
        if fix:
            yield ParameterError(parameter.name, a[parameter.name], fix)
    if a.get("storage") not in (None, "object-store", "shared-volume"):
        yield ParameterError("storage", a.get("storage"), "object-store or shared-volume")


def _overlapping_places(a: Mapping[str, Any]) -> Iterator[ParameterError]:
    """The data, the published models and the checkpoints each have a place of their own:
    outputs in the data would be trained on next run, data in an output place would be
    published or pruned with it. Each pair is checked both ways and named with both values;
    checkpoint_uri may lie inside publish_uri (its default is <publish_uri>/training: published
    models go to <publish_uri>/<run id>/ beside it), but not be it."""
    places = {
        name: _s3_place(a.get(name)) for name in ("data_uri", "publish_uri", "checkpoint_uri")
    }
    for outer, inner, both_ways in _PLACE_PAIRS:
        first, second = places[outer], places[inner]
        if first is None or second is None:
            continue  # not given, or not a URI (its own rule says so)
        if first == second:
            yield ParameterError(
                inner, a[inner], f"is {outer}={a[outer]!r} itself: {_PLACE_WHY[inner]}"
            )
        elif first.holds(second):
            yield ParameterError(
                inner, a[inner], f"lies inside {outer}={a[outer]!r}: {_PLACE_WHY[inner]}"
            )
        elif both_ways and second.holds(first):
            yield ParameterError(
                inner, a[inner], f"holds {outer}={a[outer]!r}: {_PLACE_WHY[outer]}"
            )


_PLACE_PAIRS = (
    ("data_uri", "publish_uri", True),
    ("data_uri", "checkpoint_uri", True),
    ("checkpoint_uri", "publish_uri", False),
)
"""(outer, inner, checked the other way too): the error names ``inner``."""
_PLACE_WHY = {
    "data_uri": "the data set would share its place with outputs; give each its own prefix",
    "publish_uri": "the models would be synced as training data next run, or pruned with the "
    "checkpoints; keep them elsewhere, e.g. s3://my-bucket/models/cats",
    "checkpoint_uri": "the checkpoints would be synced as training data next run; keep them "
    "elsewhere, e.g. s3://my-bucket/checkpoints/cats",
}


def _s3_place(value: Any) -> S3Uri | None:
    try:
        return parse_s3_uri(value) if value else None
    except S3UriError:
        return None


def _overrides(a: Mapping[str, Any]) -> list[ParameterError]:
    """``overrides_json``: settings no parameter has; never the trainer's arguments."""
    text = a.get("overrides_json", "")
    try:
        keys = StepOverrides.parse(text).spec_fields
    except SpecError as exc:
        return [ParameterError("overrides_json", text, str(exc))]
    by_input = step_parameters()
    errors = []
    for key in keys:
        source = spec_field_input(key)
        if key == "args":
            fix = (
                '"args" would replace the trainer\'s own arguments: give more trainer flags '
                "with -p trainer_args=[...] and the settings with their parameters"
            )
        elif source in by_input:
            name = by_input[source]
            fix = f"{key!r} is the pipeline parameter {name}: set -p {name}=... instead"
        elif source:  # a step input no parameter sets
            fix = (
                f"{key!r} is set by the pipeline (from its data, run, storage and tasks); "
                "leave it out"
            )
        else:
            continue
        errors.append(ParameterError("overrides_json", text, fix))
    return errors


def _training_job(a: Mapping[str, Any], *, alone: bool) -> list[ParameterError]:
    """The launcher's and the trainer's own checks on what the training step would run
    (``alone``: the launcher's only; the trainer's flags of the parameters failed already)."""
    try:
        inputs = TrainingStepInputs(**planned_step_inputs(a, "DIGEST"))
        custom_command = StepOverrides.parse(inputs.overrides_json).spec_fields.get("command")
        spec = training_spec(inputs, run_id="check")
        if spec.api == "auto":  # both would have to refuse it for it to fail everywhere
            _bound_to_either(spec)
    except SpecError as exc:
        return [_spec_error(exc, a)]
    if custom_command is not None or alone:  # another program's flags are its own
        return []
    try:
        check_flags(trainer_args_for(inputs))
    except ConfigError as exc:  # each parameter's flag passed alone: the rest is trainer_args'
        return [ParameterError("trainer_args", a.get("trainer_args"), str(exc))]
    return []


def _spec_error(exc: Exception, a: Mapping[str, Any]) -> ParameterError:
    """The launcher's refusal, named after the parameter that set its field (a field no
    parameter sets came from overrides_json)."""
    field = getattr(exc, "field", None)
    source = spec_field_input(field) if field else None
    parameter = step_parameters().get(source) if source else None
    if source == "data_uri":
        parameter = "data_uri"
    elif source == "checkpoint_uri":  # given, or publish_uri's default
        parameter = "checkpoint_uri" if a.get("checkpoint_uri") else "publish_uri"
    if parameter is None:
        parameter = "overrides_json"
    return ParameterError(parameter, a.get(parameter), str(exc))


def _trainer_flag_errors(a: Mapping[str, Any]) -> list[ParameterError]:
    """The trainer's own check of each parameter's flag alone (so that each names its
    parameter)."""
    by_input = step_parameters()
    errors = []
    for name, flag in trainer_flag_inputs().items():
        parameter = by_input.get(name)
        if parameter is None or parameter not in a:
            continue
        if a[parameter] in PIPELINE_VALUES.get(parameter, ()):
            continue  # the check step resolves it (pipelines.run_start)
        try:  # the parameter's own value: 0 and "" are values here, not "the trainer's default"
            check_flags(flag_args(flag, a[parameter]))
        except ConfigError as exc:
            errors.append(ParameterError(parameter, a[parameter], str(exc)))
    return errors


def _bound_to_either(spec: Any) -> None:

    errors = []
    for api in ("trainjob", "pytorchjob"):
        try:
            spec.for_api(api)
            return
        except SpecError as exc:
            errors.append(exc)
    raise errors[0]
