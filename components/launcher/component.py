"""KFP components of the launcher: thin wrappers, each body one call into ``step``.

``training_job_component`` runs the training job — a Kubeflow Trainer v2 TrainJob or a Training
Operator v1 PyTorchJob (``api``: trainjob, pytorchjob or auto), a TFJob for a TensorFlow program
(``api="tfjob"``), or local processes — and outputs the model folder (``Output[Model]``:
weights.pt, model.json, metrics.jsonl, summary.json — a TensorFlow program's model/ tree instead;
metadata arch, val_accuracy, data_digest, job_name, job_api) and the training summary
(``Output[Metrics]``).
Its parameters are exactly the fields of ``step.TrainingStepInputs`` (a test holds them equal).
``cleanup_component`` is for the pipeline's ``dsl.ExitHandler``: it deletes the run's jobs of
every API (selected by the run-id label), so a cancelled run leaves no GPUs busy.
"""

# No `from __future__ import annotations`: KFP reads the real annotation objects.
from kfp.dsl import Metrics, Model, Output, TaskConfig
from kfp.dsl.python_component import PythonComponent

from components import DEFAULT_IMAGE
from components.kfp_component import make_component


def training_job_component(
    model: Output[Model],
    metrics: Output[Metrics],
    data_dir: str = "",
    output_dir: str = "",
    data_uri: str = "",
    checkpoint_uri: str = "",
    s3_endpoint: str = "",
    s3_credentials_secret: str = "",
    api: str = "auto",
    name: str = "",
    namespace: str = "",
    image: str = "ghcr.io/kfp-ddp/kfp-ddp:0.1.0",  # a literal: KFP embeds this source alone
    workers: int = 1,
    nproc_per_node: int = 0,
    gpus_per_worker: int = 0,
    cpu_request: str = "",
    memory_request: str = "",
    trainer_args: list = [],  # noqa: B006 (a KFP parameter default, never mutated)
    model_name: str = "",
    epochs: int = 0,
    batch_size: int = 0,
    lr: float = 0.0,
    image_size: int = 0,
    checkpoint_every_steps: int = 0,
    label_smoothing: float = 0.0,
    metrics_port: int = 0,
    backend: str = "kubernetes",
    pvc_name: str = "",
    pvc_mount_path: str = "",
    data_digest: str = "",
    data_bytes: int = 0,
    overrides_json: str = "",
    cluster_settings_json: str = "",
    retrain_token: str = "",
    run_id: str = "",
    task_name: str = "train",
    task_config: TaskConfig = None,
):
    """Train on a cluster (TrainJob, PyTorchJob or TFJob) or locally; output the model and summary.

    Args:
        data_dir: the trainer's --data-dir, as the training nodes see it (on a shared claim);
            empty with data_uri.
        output_dir: base folder of the outputs, as the nodes see it (on a shared claim); the
            trainer writes to output_dir/<settings>/<data digest>. Empty: each node's own disk,
            and the model comes back through checkpoint_uri.
        data_uri: s3://bucket/prefix every node stages onto its own disk before training (no
            shared volume); empty with data_dir.
        checkpoint_uri: s3://bucket/prefix; the trainer mirrors its checkpoints to
            checkpoint_uri/<settings>/<data digest>/checkpoints (a new pod resumes from there)
            and uploads its model to .../output. Required without output_dir.
        s3_endpoint: S3 endpoint of the nodes (MinIO, Ceph...); empty for AWS.
        s3_credentials_secret: Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY that the
            nodes get as environment variables (never values in the manifest).
        api: trainjob (Trainer v2), pytorchjob (Training Operator v1), auto, or tfjob
            (TensorFlow).
        name: job name; empty derives one from the run and task, so a retry re-attaches.
        namespace: namespace of the job; empty means this step's own.
        image: image of every training node (any image with the trainer, or your own: set
            its command in overrides_json).
        workers: training nodes (pods).
        nproc_per_node: processes per node; 0 means one per GPU (1 without GPUs).
        gpus_per_worker: GPUs per node.
        cpu_request: CPU request per node, e.g. 8; empty for none.
        memory_request: memory request per node, e.g. 64Gi; empty for none.
        trainer_args: more trainer flags, e.g. ["--precision", "bf16"].
        model_name: the trainer's --model; empty keeps its default.
        epochs: --epochs; 0 keeps the trainer's default.
        batch_size: --batch-size; 0 keeps the trainer's default.
        lr: --lr; 0 keeps the trainer's default.
        image_size: --image-size; 0 keeps the trainer's default.
        checkpoint_every_steps: --checkpoint-every-steps; 0 keeps the trainer's default.
        label_smoothing: --label-smoothing; 0 keeps the trainer's default (none).
        metrics_port: Prometheus metrics port of every trainer process (local rank k on
            metrics_port + k), opened on every pod with a PodMonitor and hang/throughput
            alerts beside the job; 0: off.
        backend: kubernetes, or local (processes, for development).
        pvc_name: claim mounted into every node; empty for none.
        pvc_mount_path: where that claim is mounted, the same path as in this step.
        data_digest: the data's listing digest (a caching key, kept in the Model's metadata).
        data_bytes: the data set's size in bytes (sizes each node's staging volume); 0 unknown.
        overrides_json: JSON object of more TrainSpec fields, e.g. {"command": ["python",
            "my_train.py"], "shm_size": "8Gi"}, and "backend_options" for the backend; not
            the node-access fields (see cluster_settings_json).
        cluster_settings_json: JSON object of the fields that open the node (pod_security,
            capabilities, host_network, stage_cache_host_path): whoever compiles the pipeline
            sets them; never wire a UI parameter to it.
        retrain_token: any new value trains from scratch in a fresh output folder.
        run_id: the KFP run id; empty reads it from the output artifact's URI.
        task_name: the task name in the job's labels and default name; give every training
            task of a pipeline its own.
        task_config: filled by KFP's backend (2.15.0+) from the training task's own settings,
            never passed: .set_accelerator_type()/.set_accelerator_limit() (GPUs per node),
            .set_cpu_request()/.set_memory_request() and limits (per node), env,
            kubernetes.add_toleration(), add_node_selector(), add_node_affinity(), mount_pvc(),
            use_secret_as_env()... A setting also given by a parameter must agree with it.

    Returns:
        model: the model folder: weights.pt, model.json, metrics.jsonl, summary.json; metadata:
            arch, val_accuracy, data_digest, job_name, job_api, world_size, restarts,
            tensorboard (the folder or S3 URI of the TensorBoard files).
        metrics: the training summary: val_accuracy, val_loss, final_train_loss, steps,
            epochs, world_size, wall_time_s, images_per_sec, job_duration_s, job_restarts...
    """
    given = {k: v for k, v in locals().items() if k not in ("model", "metrics")}  # the parameters
    from components.launcher.step import TrainingStepInputs, run_training_step

    run_training_step(TrainingStepInputs(**given), model=model, metrics=metrics)


def cleanup_component(run_id: str, namespace: str, backend: str) -> int:
    """Delete the training jobs (every API) labelled with run_id (for a dsl.ExitHandler).

    Args:
        run_id: the KFP run id whose jobs to delete (dsl.PIPELINE_JOB_ID_PLACEHOLDER).
        namespace: namespace of the jobs; empty means this step's own.
        backend: kubernetes, or local (nothing to delete).

    Returns:
        Output: how many jobs were deleted.
    """
    from components.launcher.step import cleanup_step

    return cleanup_step(run_id=run_id, namespace=namespace, backend=backend)


def make_training_job_op(
    image: str = DEFAULT_IMAGE, *, forward_task_config: bool = True
) -> PythonComponent:
    """The training component on ``image``; its training nodes run ``image`` too by default.

    ``forward_task_config``: declare ``task_config_passthroughs`` (``task_config.passthroughs``):
    the task's resources, tolerations, node selector and affinity go to the job's nodes, not to
    this step's pod; its env and volumes to both. False: the task's settings are this step's
    own, as for any component (KFP then refuses none of them).
    """
    from components.launcher.task_config import passthroughs

    forwarded = passthroughs() if forward_task_config else None
    op = make_component(training_job_component, image=image, task_config_passthroughs=forwarded)
    # The source's literal default is the release image; the component's spec says which image
    # this one runs (KFP passes the spec's default to the function).
    op.component_spec.inputs["image"].default = image
    return op


def make_cleanup_op(image: str = DEFAULT_IMAGE) -> PythonComponent:
    """The ExitHandler cleanup component on ``image``."""
    return make_component(cleanup_component, image=image)
