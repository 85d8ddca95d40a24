"""KFP components of the launcher: thin wrappers, each body one call into ``step``.

``training_job_component`` runs the training job — a Kubeflow Trainer v2 TrainJob or a Training
Operator v1 PyTorchJob (``api``: trainjob, pytorchjob or auto), a TFJob or an XGBoostJob for a
TensorFlow or XGBoost program (``api="tfjob"``, ``"xgboostjob"``), an MPI Operator MPIJob
(``api="mpijob"``: our trainer under mpirun, or an MPI program), a KubeRay RayJob
(``api="rayjob"``: our trainer under Ray Train, or a Ray program), or local processes — and
outputs the model folder (``Output[Model]``: weights.pt, model.json, metrics.jsonl, summary.json —
a TensorFlow or XGBoost program's model/ tree instead;
metadata arch, val_accuracy, data_digest, job_name, job_api) and the training summary
(``Output[Metrics]``).
Its parameters are the fields of ``step.TrainingStepInputs``, declared once there:
``training_job_source`` writes the function, its signature and its docstring's ``Args`` from
them, into ``generated_training_job.py`` (``make components``; a test holds it current).
``cleanup_component`` is for the pipeline's ``dsl.ExitHandler``: it deletes the run's jobs of
every API (selected by the run-id label), so a cancelled run leaves no GPUs busy.
"""

# No `from __future__ import annotations`: KFP reads the real annotation objects.
import dataclasses
from collections.abc import Callable
from typing import Any

from kfp.dsl.python_component import PythonComponent

from components import DEFAULT_IMAGE
from components.kfp import generated_training_job
from components.kfp.factory import make_component
from components.kfp.function import (
    REQUIRED,
    FunctionInput,
    docstring,
    function_source,
    module_source,
    with_defaults,
)
from components.launcher.step import KFP_DEFAULT, TRAINER_SETTING, TrainingStepInputs
from components.launcher.task_config import passthroughs
from kfp_ddp.field_docs import field_docs
from trainer import config as trainer_config

TRAINING_OUTPUTS = (
    FunctionInput(name="model", annotation="Output[Model]"),
    FunctionInput(name="metrics", annotation="Output[Metrics]"),
)
"""The training component's own parameters beside the step's inputs: its output artifacts."""
TRAINING_SUMMARY = (
    "Train on a cluster (TrainJob, PyTorchJob, TFJob or XGBoostJob) or locally; output the model "
    "and summary."
)
TRAINING_RETURNS = """Returns:
    model: the model folder: weights.pt, model.json, metrics.jsonl, summary.json; metadata:
        arch, val_accuracy, data_digest, job_name, job_api, world_size, restarts,
        tensorboard (the folder or S3 URI of the TensorBoard files).
    metrics: the training summary: val_accuracy, val_loss, final_train_loss, steps,
        epochs, world_size, wall_time_s, images_per_sec, job_duration_s, job_restarts..."""


def step_function_inputs(inputs_class: type, *, image: str) -> list[FunctionInput]:
    """The fields of ``inputs_class`` (a step's inputs dataclass) as a KFP function's inputs: its
    type, default (``kfp_default`` in its metadata, where given) and field docstring; ``image``'s
    default is ``image``. A field whose default is None declares its type alone
    (``task_config: TaskConfig = None``: KFP's optional input)."""
    docs = field_docs(inputs_class, keep_lines=True)
    trainer_docs = trainer_config.field_docs()
    inputs = []
    for f in dataclasses.fields(inputs_class):
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        if f.name == "image":
            default = image
        default = f.metadata.get(KFP_DEFAULT, default)
        annotation = f.type if isinstance(f.type, str) else f.type.__name__
        if f.default is None:
            annotation = annotation.removesuffix(" | None")
        inputs.append(
            FunctionInput(
                name=f.name,
                annotation=annotation,
                default=default,
                doc=docs.get(f.name) or _trainer_doc(f, trainer_docs),
            )
        )
    return inputs


def _trainer_doc(f: dataclasses.Field, trainer_docs: dict[str, str]) -> str:
    """A trainer setting's description: its flag and the trainer's own help."""
    name = f.metadata.get(TRAINER_SETTING)
    if name is None:
        return ""
    return f"{f.metadata['flag']}: {trainer_docs.get(name, '')}"


TRAINING_IMPORTS = ("from kfp.dsl import Metrics, Model, Output, TaskConfig",)
"""What the annotations of the training component's function need."""


def training_job_source(inputs_class: type = TrainingStepInputs) -> str:
    """The module of the training component's function: ``model`` and ``metrics`` (its outputs),
    then the fields of ``inputs_class`` (``step.TrainingStepInputs``, or a subclass declaring
    more); its body builds an ``inputs_class`` from its parameters and calls
    ``step.run_training_step``. ``generated_training_job.py`` is this module for the step's
    inputs; write one for a subclass of your own and pass its function to
    ``make_training_job_op``."""
    inputs = list(TRAINING_OUTPUTS) + step_function_inputs(inputs_class, image=DEFAULT_IMAGE)
    name = inputs_class.__name__
    function = function_source(
        "training_job_component",
        inputs,
        doc=docstring(TRAINING_SUMMARY, inputs, returns=TRAINING_RETURNS),
        body=f"""
given = {{k: v for k, v in locals().items() if k not in ("model", "metrics")}}  # the parameters
# KFP runs this function alone, in the image: what it calls is imported here.
from {inputs_class.__module__} import {name}
from components.launcher.step import run_training_step

run_training_step({name}(**given), model=model, metrics=metrics)
""",
    )
    summary = (
        f"The training component's function, its parameters the fields of "
        f"``{inputs_class.__module__}.{name}`` (``components.kfp.launcher.training_job_source``)."
    )
    return module_source(summary, TRAINING_IMPORTS, function)


def training_job_function(
    image: str = DEFAULT_IMAGE, *, function: Callable[..., None] | None = None
) -> Callable[..., None]:
    """The training component's function with ``image`` as its ``image`` default: the step's
    (``generated_training_job``), or ``function``, one written by ``training_job_source`` for a
    subclass of the step's inputs."""
    return with_defaults(function or generated_training_job.training_job_component, image=image)


training_job_component = training_job_function()


def cleanup_component(run_id: str, namespace: str, backend: str) -> int:
    """Delete the training jobs (every API) labelled with run_id (for a dsl.ExitHandler).

    Args:
        run_id: the KFP run id whose jobs to delete (dsl.PIPELINE_JOB_ID_PLACEHOLDER).
        namespace: namespace of the jobs; empty means this step's own.
        backend: kubernetes, or local (nothing to delete).

    Returns:
        Output: how many jobs were deleted.
    """
    # KFP runs this function's body alone, in the image: its imports are inside it.
    from components.launcher.step import cleanup_step

    return cleanup_step(run_id=run_id, namespace=namespace, backend=backend)


def make_training_job_op(
    image: str = DEFAULT_IMAGE,
    *,
    forward_task_config: bool = True,
    function: Callable[..., None] | None = None,
) -> PythonComponent:
    """The training component on ``image``; its training nodes run ``image`` too by default.
    ``function``: its function for a subclass of the step's inputs declaring more
    (``training_job_source``), else the step's own.

    ``forward_task_config``: declare ``task_config_passthroughs`` (``task_config.passthroughs``):
    the task's resources, tolerations, node selector and affinity go to the job's nodes, not to
    this step's pod; its env and volumes to both. False: the task's settings are this step's
    own, as for any component (KFP then refuses none of them).
    """
    forwarded = passthroughs() if forward_task_config else None
    # Its training nodes' default image: ``image``.
    chosen = training_job_function(image, function=function)
    return make_component(chosen, image=image, task_config_passthroughs=forwarded)


def make_cleanup_op(image: str = DEFAULT_IMAGE) -> PythonComponent:
    """The ExitHandler cleanup component on ``image``."""
    return make_component(cleanup_component, image=image)
