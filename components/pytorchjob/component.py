"""KFP components of the launcher: thin wrappers, each body one call into ``kfp_step``.

``pytorchjob_component`` runs the training job (backend ``kubernetes`` or ``local``) and outputs
the model folder (``Output[Model]``: weights.pt, model.json, metrics.jsonl, summary.json; metadata
arch, val_accuracy, data_digest) and the training summary (``Output[Metrics]``).
``pytorchjob_cleanup_component`` is for the pipeline's ``dsl.ExitHandler``: it deletes the run's
PyTorchJobs (selected by the run-id label), so a cancelled run leaves no GPUs busy.

Pass ``run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER`` to both; without it the training step reads the
run id from its output artifact's URI.
"""

# No `from __future__ import annotations`: KFP reads the real annotation objects.
from kfp.dsl import Metrics, Model, Output
from kfp.dsl.python_component import PythonComponent

from components import DEFAULT_IMAGE
from components.kfp_component import make_component


def pytorchjob_component(
    name: str,
    namespace: str,
    image: str,
    workers: int,
    nproc_per_node: int,
    gpus_per_worker: int,
    data_dir: str,
    output_dir: str,
    trainer_args: list,
    backend: str,
    pvc_name: str,
    pvc_mount_path: str,
    data_digest: str,
    overrides_json: str,
    model: Output[Model],
    metrics: Output[Metrics],
    model_name: str = "",
    epochs: int = 0,
    batch_size: int = 0,
    lr: float = 0.0,
    image_size: int = 0,
    checkpoint_every_steps: int = 0,
    run_id: str = "",
):
    """Train with a PyTorchJob (or local processes) and output the model and its summary.

    Args:
        name: job name; '' derives one from the run and task (a retry re-attaches).
        namespace: '' = the step's own namespace.
        image: image of every replica.
        workers: pods (1 Master + workers-1 Workers).
        nproc_per_node: processes per pod (GPUs per pod).
        gpus_per_worker: GPUs per pod (nvidia.com/gpu).
        data_dir: the trainer's --data-dir (on the shared volume).
        output_dir: the trainer's --output-dir (on the shared volume).
        trainer_args: more trainer flags, e.g. ["--precision", "bf16"].
        backend: kubernetes | local.
        pvc_name: claim mounted into every replica ('' = none).
        pvc_mount_path: where it is mounted (the same path as in this step).
        data_digest: the data's listing digest (caching key; Model metadata).
        overrides_json: JSON object of more TrainSpec fields, plus "backend_options".
        model_name: --model ('' = trainer default); also epochs, batch_size, lr, image_size,
            checkpoint_every_steps (0 = trainer default).
        run_id: the KFP run id (dsl.PIPELINE_JOB_ID_PLACEHOLDER): the job's run-id label.
    """
    from components.pytorchjob.kfp_step import run_training_step

    run_training_step(
        model=model,
        metrics=metrics,
        name=name,
        namespace=namespace,
        image=image,
        workers=workers,
        nproc_per_node=nproc_per_node,
        gpus_per_worker=gpus_per_worker,
        data_dir=data_dir,
        output_dir=output_dir,
        trainer_args=trainer_args,
        backend=backend,
        pvc_name=pvc_name,
        pvc_mount_path=pvc_mount_path,
        data_digest=data_digest,
        overrides_json=overrides_json,
        model_name=model_name,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        image_size=image_size,
        checkpoint_every_steps=checkpoint_every_steps,
        run_id=run_id,
    )


def pytorchjob_cleanup_component(run_id: str, namespace: str, backend: str) -> int:
    """Delete the PyTorchJobs labelled with ``run_id`` (ExitHandler); returns how many."""
    from components.pytorchjob.kfp_step import cleanup_step

    return cleanup_step(run_id=run_id, namespace=namespace, backend=backend)


def make_pytorchjob_op(image: str = DEFAULT_IMAGE) -> PythonComponent:
    """The training component on ``image``."""
    return make_component(pytorchjob_component, image=image)


def make_cleanup_op(image: str = DEFAULT_IMAGE) -> PythonComponent:
    """The ExitHandler cleanup component on ``image``."""
    return make_component(pytorchjob_cleanup_component, image=image)
