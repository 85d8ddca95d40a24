"""Checks that used to wait for a late step, moved to the run's first step: what a run would meet
beyond each argument's own value. Each names the parameter the user set, its value and the fix.

- ``configuration_problems(arguments)``, pure (``pipelines.validation.check_arguments`` calls it,
  so the CLI refuses before it submits and the check step refuses again for a UI run):
  - ``overrides_json``' ``backend_options``: parsed by the backend's own options class, which
    names an unknown key and the nearest known one (the training step found them only after the
    data step);
  - ``gpus_per_worker`` with the local backend (``kfp-ddp run-local``, kfp.local): every node
    runs on this machine, which must have the GPUs (training otherwise failed three times).
- ``baseline_problems(arguments)`` (``check_baseline`` raises them), the check step only:
  ``baseline_uri`` read the way the evaluation step reads it
  (``components.evaluate.gate.load_baseline``: the same endpoint and the same credentials,
  which the check step gets like the data and evaluation steps), so a missing baseline fails in
  seconds rather than after the training.
- ``model_input_problems(arguments)`` (``check_model_input`` raises them), the check step and
  the CLI before it submits (torch and torchvision: seconds, so not in ``check_arguments``):
  whether the model takes the training images' size, and a batch of ``batch_size`` of them
  (``trainer.model_shapes``, on the meta device), which failed in the first training step once
  every node had started (inception_v3 needs 75 px or more, the ViTs exactly 224; BatchNorm
  refuses a batch of one image at small sizes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.evaluate.errors import EvaluationError
from components.evaluate.gate import load_baseline
from components.launcher import SpecError
from components.launcher.options import OPTIONS_OF_BACKEND
from components.launcher.step import StepOverrides, TrainingStepInputs, trainer_args_for
from pipelines.parameter_errors import ArgumentError, ParameterError
from pipelines.plan import planned_step_inputs
from trainer.flags import check_flags


def configuration_problems(arguments: Mapping[str, Any]) -> list[ParameterError]:
    """What the training step's backend would refuse, found without talking to anything."""
    return backend_options_problems(arguments) + local_gpu_problems(arguments)


def backend_options_problems(arguments: Mapping[str, Any]) -> list[ParameterError]:
    """``overrides_json``' ``backend_options`` as the backend would parse them (unknown keys,
    with the nearest known one; bad values)."""

    text = arguments.get("overrides_json") or ""
    options_class = OPTIONS_OF_BACKEND.get(arguments.get("backend") or "kubernetes")
    if options_class is None or not isinstance(text, str):
        return []  # an unknown backend is a compile-time error, a non-string another check's
    try:
        options = StepOverrides.parse(text).backend_options
    except SpecError:
        return []  # not a JSON object: the training job's check names overrides_json already
    try:
        options_class.from_dict(options)
    except SpecError as exc:
        return [ParameterError("overrides_json", text, str(exc))]
    return []


def local_gpu_problems(arguments: Mapping[str, Any]) -> list[ParameterError]:
    """With the local backend every node runs here: ``gpus_per_worker`` GPUs must exist."""
    wanted = arguments.get("gpus_per_worker")
    if arguments.get("backend") != "local" or not isinstance(wanted, int) or wanted <= 0:
        return []
    found, why = local_gpus()
    if wanted <= found:
        return []
    return [
        ParameterError(
            "gpus_per_worker",
            wanted,
            f"the local backend runs every node on this machine, where torch finds {found} "
            f"CUDA GPU{'s' if found != 1 else ''}{why}; set gpus_per_worker=0 to train on the "
            f"CPU (gloo){f' or at most {found}' if found else ''}, or run on a cluster "
            "(kfp-ddp run)",
        )
    ]


def local_gpus() -> tuple[int, str]:
    """The CUDA GPUs torch can use on this machine, and why there are none (or '')."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), ""
    if torch.version.cuda is None:
        return 0, f" (this torch {torch.__version__} is a CPU-only build)"
    return 0, ""


def baseline_problems(arguments: Mapping[str, Any]) -> list[ParameterError]:
    """``baseline_uri`` read as the evaluation step reads it ('' is "no baseline").

    An ``s3://`` URI is read through ``s3_endpoint`` with this step's credentials. A path is
    checked only with the local backend, where every step shares this machine's files; on a
    cluster the evaluation reads it from its own volumes, which the check step does not mount.
    """

    uri = arguments.get("baseline_uri") or ""
    if not isinstance(uri, str) or not uri:
        return []
    if not uri.startswith("s3://") and arguments.get("backend") != "local":
        return []
    try:
        load_baseline(uri, endpoint_url=arguments.get("s3_endpoint") or None)
    except EvaluationError as exc:
        why = str(exc).removeprefix(f"baseline_uri={uri!r}").lstrip(": ")
        return [
            ParameterError(
                "baseline_uri",
                uri,
                f"{why} (the evaluation gate compares the new model with this baseline)",
            )
        ]
    return []


def check_baseline(arguments: Mapping[str, Any]) -> None:
    """Raise ArgumentError unless ``baseline_uri`` is '' or a baseline the evaluation can read."""
    problems = baseline_problems(arguments)
    if problems:
        raise ArgumentError(problems)


def model_input_problems(arguments: Mapping[str, Any]) -> list[ParameterError]:
    """Whether the trainer's model takes its images' size, and batches of ``batch_size`` of them
    (pipeline parameters, which ``trainer_args`` cannot set); nothing to check for a command of
    one's own."""
    # Here, not at the top: torch and torchvision (seconds), which the other checks do not need.
    from trainer.model_shapes import model_input_problem

    inputs = TrainingStepInputs(**planned_step_inputs(arguments, "DIGEST"))
    if StepOverrides.parse(inputs.overrides_json).spec_fields.get("command") is not None:
        return []
    config = check_flags(trainer_args_for(inputs))
    found = model_input_problem(config.model, config.image_size, config.batch_size)
    if found is None:
        return []
    setting, problem = found
    return [ParameterError(setting, arguments.get(setting), problem)]


def check_model_input(arguments: Mapping[str, Any]) -> None:
    """Raise ArgumentError unless the model takes the training images' size."""
    problems = model_input_problems(arguments)
    if problems:
        raise ArgumentError(problems)
