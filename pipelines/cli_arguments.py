"""Pipeline arguments on the command line: ``-p key=value`` typed by the declared parameters,
the declared defaults filled in, and every value checked before anything is submitted."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import click

from pipelines.package import declared_inputs, default_arguments
from pipelines.parameters import RENAMED_PARAMETERS
from pipelines.plan import DEFAULT_STORAGE, WORKSPACE_MOUNT_PATH

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


def _boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(raw)


def _json_of(kind: type) -> Any:
    def parse(raw: str) -> Any:
        value = json.loads(raw)
        if not isinstance(value, kind):
            raise ValueError(raw)
        return value

    return parse


CONVERTERS = {
    "STRING": (str, "a string"),
    "NUMBER_INTEGER": (int, "an integer"),
    "NUMBER_DOUBLE": (float, "a number"),
    "BOOLEAN": (_boolean, "true or false"),
    "LIST": (_json_of(list), "a JSON list"),
    "STRUCT": (_json_of(dict), "a JSON object"),
}
"""KFP parameter type → (conversion of the command-line text, what it expects)."""


def _convert(key: str, raw: str, parameter_type: str) -> Any:
    convert, expected = CONVERTERS.get(parameter_type, (str, "a string"))
    try:
        return convert(raw)
    except ValueError:
        raise click.BadParameter(
            f"pipeline parameter {key!r} expects {expected}, got {raw!r}", param_hint="'-p'"
        ) from None


def parse_parameters(pairs: Sequence[str], inputs: dict[str, dict]) -> dict[str, Any]:
    """Turn repeated ``-p key=value`` into typed arguments, checked against ``inputs``."""
    arguments: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(
                f"{pair!r} is not key=value (e.g. -p epochs=5)", param_hint="'-p'"
            )
        if key in RENAMED_PARAMETERS:
            new_name = RENAMED_PARAMETERS[key]
            click.secho(
                f"WARNING: -p {key} is now -p {new_name} (kfp-ddp 0.2.0, see CHANGELOG.md); "
                "the old name stops working in 0.3.0",
                err=True,
                fg="yellow",
            )
            key = new_name
        if key not in inputs:
            close = difflib.get_close_matches(key, list(inputs), n=1, cutoff=0.75)
            raise click.BadParameter(
                f"unknown pipeline parameter {key!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + "; valid parameters: "
                + ", ".join(sorted(inputs)),
                param_hint="'-p'",
            )
        if key in arguments:
            raise click.BadParameter(f"pipeline parameter {key!r} given twice", param_hint="'-p'")
        arguments[key] = _convert(key, raw, inputs[key].get("parameterType", "STRING"))
    missing = sorted(
        name
        for name, spec in inputs.items()
        if name not in arguments and "defaultValue" not in spec and not spec.get("isOptional")
    )
    if missing:
        raise click.BadParameter(
            "missing required pipeline parameter(s): " + ", ".join(missing), param_hint="'-p'"
        )
    return arguments


def pipeline_inputs(storage: str | None = None) -> dict[str, dict]:
    """The declared parameters (name → type, default...) of the training pipeline compiled for
    ``storage`` (default: the default storage)."""
    from google.protobuf import json_format

    # Here, not at the top: building the pipeline imports every component and the cluster
    # clients (~4 s), which the CLI's --help and its other commands do not need.
    from pipelines.training import build_training_pipeline

    pipeline = build_training_pipeline(storage=storage or DEFAULT_STORAGE)
    return declared_inputs(json_format.MessageToDict(pipeline.pipeline_spec))


def with_defaults(arguments: Mapping[str, Any], storage: str | None = None) -> dict[str, Any]:
    """``arguments`` over the declared defaults of the pipeline compiled for ``storage``."""
    return default_arguments(pipeline_inputs(storage)) | dict(arguments)


def checked_arguments(arguments: Mapping[str, Any], **compile_time: Any) -> None:
    """Check every argument (with the declared defaults) before anything is submitted.

    ``compile_time``: the values the pipeline fixes when it is compiled (backend,
    workspace_path, storage, cluster_settings). A problem exits 2, one line each: parameter,
    value, fix.
    """
    # Here, not at the top: the checks import the trainer's (torch, ~2 s; the model's image
    # size, torchvision), which the CLI's --help and its other commands do not need.
    from pipelines.late_checks import check_model_input
    from pipelines.validation import ArgumentError, check_arguments

    complete = with_defaults(arguments, compile_time.get("storage"))
    fixed = {
        "backend": "kubernetes",
        "workspace_path": WORKSPACE_MOUNT_PATH,
        "cluster_settings": "",
    }
    complete |= fixed | {"storage": DEFAULT_STORAGE} | compile_time
    try:
        check_arguments(complete)
        check_model_input(complete)
    except ArgumentError as exc:
        raise click.UsageError(
            "bad pipeline argument(s):\n" + "\n".join(f"  -p {p}" for p in exc.problems)
        ) from None
