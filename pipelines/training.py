"""The training pipeline: check → data → training job (DDP) → evaluate → publish if it passed.

``build_training_pipeline(image, storage=...)`` returns the ``@dsl.pipeline``; every step runs
``image`` (a compile-time setting, like the components' factories, and like ``backend``,
``workspace_path`` and ``storage``: no UI parameters). Locally (``pipelines.local_run``,
``kfp-ddp run-local``) the training nodes run as local processes.

Two storage modes, a compile-time choice (``kfp-ddp compile --storage``):

- ``object-store`` (the default): no claim at all, so it runs on any cluster (EBS, Persistent
  Disk and Azure Disk are ReadWriteOnce). The data step only lists ``data_uri`` (layout check and
  digest, nothing downloaded); every training node stages the data onto its own disk before the
  trainer starts (an init container or a command prefix, checking that digest); the trainer
  mirrors its checkpoints to ``checkpoint_uri`` (default ``<publish_uri>/training``) and uploads
  its model there; the training step hands the model on as a KFP artifact; the evaluation reads
  ``val/`` from S3; publishing uploads the model artifact.
- ``shared-volume``: the steps and the nodes share the ReadWriteMany claim ``workspace_pvc``
  mounted at ``/workspace`` (or a claim the run creates: ``workspace_size``). The data step syncs
  ``data_uri`` into a folder of its own source, checks the train/ and val/ splits and freezes
  what it synced by digest (``pipelines.dataset``).

The first step checks every argument (``pipelines.validation``), so a run started from the UI
with a bad value fails in seconds, before any data moves or any GPU starts. The training step
launches a Kubeflow Trainer v2 TrainJob or a Training Operator v1 PyTorchJob (``api``:
``auto`` picks whichever the cluster serves); its inputs come from ``training_step_inputs`` — the
one mapping from pipeline parameters to the step, which ``kfp-ddp render`` calls too, so render
prints what the step would submit.

Caching. The data step is never cached (it must look at S3 every time) and returns the digest of
the listing. That digest is an input of the training step, so a scheduled run whose data
and parameters did not change gets the cached model (and cached evaluation) instead of retraining.
The trainer's output folder (and its S3 folder) is derived from the settings and the digest
(not the run), so a retried step resumes its own checkpoints and the step's inputs stay
cacheable. To force a retrain: ``kfp-ddp run --no-cache`` (caching off on every task,
including those inside the exit handler, plus a fresh ``retrain_token``), or pass a new
``retrain_token`` with caching off in the UI.

kfp-kubernetes 2.17 accepts pipeline parameters for the claim name (``mount_pvc``) and the
Secret name (``use_secret_as_env``): they compile to ``pvcNameParameter`` /
``secretNameParameter``, which the KFP backend resolves at run time. The mount path must be a
compile-time string (``WORKSPACE_MOUNT_PATH``).

Credentials. S3 keys come from a Kubernetes Secret (``s3_credentials_secret``, keys
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) attached as environment variables with
kfp-kubernetes; they are never parameters and never in the compiled YAML. ``kfp.local`` ignores
kfp-kubernetes settings, so local runs take them from the caller's environment.
"""

# No `from __future__ import annotations`: KFP reads the artifact types from real annotations.

from collections.abc import Callable, Mapping
from typing import Any

from kfp import dsl

from components import DEFAULT_IMAGE
from components.kfp.evaluate import make_evaluate_op
from components.kfp.factory import make_component
from components.kfp.function import docstring
from components.kfp.launcher import make_cleanup_op, make_training_job_op
from components.kfp.s3_sync import use_s3_credentials
from pipelines.generated_check_step import check_arguments_step
from pipelines.parameters import PARAMETERS, declared, function_inputs, signature
from pipelines.plan import (
    DEFAULT_STORAGE,
    WORKSPACE_MOUNT_PATH,
    check_build_options,
    cluster_settings_json,
    training_step_inputs,
)
from pipelines.steps import (
    list_dataset_step,
    publish_model_step,
    stage_dataset_step,
)

PIPELINE_NAME = "kfp-ddp-training"
RUN_SIZE_INPUTS = (
    "workers",
    "gpus_per_worker",
    "nproc_per_node",
    "batch_size",
    "epochs",
    "image_size",
)
"""The parameters the data step checks against the images it counts (``pipelines.run_size``)."""
STEP_REQUESTS = {
    "check": ("100m", "512Mi"),
    "data": ("500m", "1Gi"),
    "train": ("250m", "1Gi"),
    "evaluate": ("2", "4Gi"),
    "publish": ("500m", "1Gi"),
    "cleanup": ("100m", "256Mi"),
}
"""CPU and memory each step requests (never BestEffort; a namespace's ResourceQuota counts
them): the check makes API calls and puts one batch of the training's image size through the
model on the meta device (torch and torchvision: ~375 MB at its peak, measured); the cleanup
makes API calls; the data step lists or syncs the data set; the training step follows the job
and exports the model; the evaluation scores the model on the validation split on its CPUs;
publishing uploads the model."""
DESCRIPTIONS = {
    "object-store": (
        "Train an ImageFolder from S3 with PyTorch DDP as a Kubeflow TrainJob or PyTorchJob "
        "(every node stages the data on its own disk; checkpoints and the model go through S3: "
        "no shared volume), evaluate, and publish the model to S3 only if it passes the gate."
    ),
    "shared-volume": (
        "Sync an ImageFolder from S3 to a workspace volume, train with PyTorch DDP as a "
        "Kubeflow TrainJob or PyTorchJob, evaluate, and publish the model to S3 only if it "
        "passes the gate."
    ),
}


def build_training_pipeline(
    image: str = DEFAULT_IMAGE,
    *,
    backend: str = "kubernetes",
    workspace_path: str = WORKSPACE_MOUNT_PATH,
    storage: str = DEFAULT_STORAGE,
    workspace_size: str | None = None,
    storage_class: str = "",
    cluster_settings: Mapping[str, Any] | None = None,
):
    """The training pipeline with every step on ``image``.

    Args:
        image: container image of every step (and the default image of the training nodes).
        backend: ``kubernetes`` (a TrainJob/PyTorchJob) or ``local`` (processes: run-local).
        workspace_path: where the steps see the workspace (``/workspace``, the claim's mount
            path; a local folder for run-local). Shared-volume storage only.
        storage: ``object-store`` (no claim at all: the data step only lists the data set, every
            training node stages it onto its own disk, checkpoints and the model go through S3
            under ``checkpoint_uri``) or ``shared-volume`` (the steps and the nodes share the
            ReadWriteMany claim ``workspace_pvc``).
        workspace_size: shared-volume only. ``None`` (default): the steps mount an existing
            claim named by the ``workspace_pvc`` parameter. A size such as ``"50Gi"``: the run
            creates its own ReadWriteMany claim named after the run id (``CreatePVC``) and
            deletes it (``DeletePVC``) after the last step of either branch (publish, or the
            evaluation when the gate fails). KFP allows one exit handler and an exit task may
            depend on no other task, so a run that fails midway leaves its claim behind (delete
            it by the run id). ``workspace_pvc`` is then unused. Such a pipeline cannot run
            under ``kfp.local`` (CreatePVC/DeletePVC are container components).
        storage_class: StorageClass of the created claim ('' = the cluster default).
        cluster_settings: TrainSpec fields for every training job that are an admin's choice,
            never a UI parameter: those that open the node (``pod_security``,
            ``capabilities``, ``host_network``, ``stage_cache_host_path``) and any other, e.g.
            ``{"pod_security": "privileged", "stage_cache_host_path": "/mnt/kfp-ddp-cache"}``
            for a node-local data cache. ``overrides_json`` may not set the node-access ones.
    """
    from kfp import kubernetes

    check_build_options(backend, storage, workspace_size)
    settings = cluster_settings_json(cluster_settings)
    shared = storage == "shared-volume"
    check_op = make_component(check_arguments_step, image=image)
    data_op = make_component(stage_dataset_step if shared else list_dataset_step, image=image)
    # The step's own pod requests STEP_REQUESTS and mounts the workspace; the nodes' sizes are
    # parameters. A component with task_config_passthroughs would send the step's requests to
    # the nodes instead (and KFP refuses requests on such a task unless RESOURCES is forwarded).
    train_op = make_training_job_op(image, forward_task_config=False)
    evaluate_op = make_evaluate_op(image)
    cleanup_op = make_cleanup_op(image)
    publish_op = make_component(publish_model_step, image=image)

    def steps(
        arguments: dict[str, Any],
        *,
        pvc_name: Any,
        when_done: Callable[[dsl.PipelineTask], Any] | None = None,
    ) -> None:
        a = arguments

        def on_workspace(task: dsl.PipelineTask) -> dsl.PipelineTask:
            if not shared:
                return task
            return kubernetes.mount_pvc(task, pvc_name=pvc_name, mount_path=WORKSPACE_MOUNT_PATH)

        def with_s3(task: dsl.PipelineTask) -> dsl.PipelineTask:
            return use_s3_credentials(task, a["s3_credentials_secret"])

        check = requesting(check_op(**a).set_display_name("check the arguments"), "check")
        with_s3(check)  # it reads an s3:// baseline_uri as the evaluation will

        size = {name: a[name] for name in RUN_SIZE_INPUTS}
        if shared:
            data = data_op(
                data_uri=a["data_uri"],
                endpoint_url=a["s3_endpoint"],
                workspace_path=workspace_path,
                **size,
            ).set_display_name("stage data from S3")
            data_dir = data.outputs["data_dir"]
        else:
            data = data_op(data_uri=a["data_uri"], endpoint_url=a["s3_endpoint"], **size)
            data.set_display_name("list the data in S3")
            data_dir = a["data_uri"]
        requesting(data, "data").after(check)
        data.set_caching_options(False)  # must look at S3 every run; its digest drives caching
        with_s3(on_workspace(data))

        train = train_op(
            **training_step_inputs(
                a,
                data_dir=data_dir,
                data_digest=data.outputs["digest"],
                pvc_name=pvc_name,
                checkpoint_uri=check.outputs["checkpoint_uri"],
                init_from=check.outputs["init_from"],
                data_bytes=0 if shared else data.outputs["size_bytes"],
            )
        ).set_display_name("train (TrainJob / PyTorchJob)")
        requesting(train, "train")
        set_train_retry(train)
        on_workspace(train)
        if not shared:
            with_s3(train)  # the model comes back through S3

        evaluation = evaluate_op(
            model=train.outputs["model"],
            data_dir=data_dir,
            threshold=a["accuracy_threshold"],
            baseline_uri=check.outputs["baseline_uri"],
            tolerance=a["tolerance"],
            endpoint_url=a["s3_endpoint"],
        ).set_display_name("evaluate")
        # S3 data (object-store), an s3:// baseline
        with_s3(on_workspace(requesting(evaluation, "evaluate")))

        with dsl.If(evaluation.outputs["Output"] == True, name="passed"):  # noqa: E712 (KFP condition)
            publish = publish_op(
                model=train.outputs["model"],
                report=evaluation.outputs["report"],
                evaluation=evaluation.outputs["evaluation"],
                publish_uri=a["publish_uri"],
                endpoint_url=a["s3_endpoint"],
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                latest_run=check.outputs["latest_run"],
                data_digest=data.outputs["digest"],
            ).set_display_name("publish the model to S3")
            requesting(publish, "publish")
            # Never cached: every run publishes to its own prefix (kfp.local would also key its
            # cache on the unresolved run-id placeholder and hand back another run's URI).
            publish.set_caching_options(False)
            with_s3(publish)
            if when_done is not None:
                when_done(publish)
        if when_done is not None:
            with dsl.Else(name="not-passed"):
                when_done(evaluation)

    def training_pipeline(**given: Any) -> None:
        arguments = dict(given)
        namespace = arguments["namespace"]
        arguments |= {"backend": backend, "workspace_path": workspace_path, "storage": storage}
        arguments["cluster_settings"] = settings
        cleanup = cleanup_op(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, namespace=namespace, backend=backend
        ).set_display_name("delete leftover training jobs")
        requesting(cleanup, "cleanup").set_caching_options(False)
        if workspace_size is None:
            with dsl.ExitHandler(cleanup, name="train-evaluate-publish"):
                steps(arguments, pvc_name=arguments["workspace_pvc"])
            return
        # KFP allows one exit handler per pipeline and an exit task may depend on no other
        # task, so the exit handler deletes leftover training jobs (GPUs cost more than storage)
        # and the claim is deleted by the last step of each branch: a failed run leaves it
        # behind (named after the run id, so it is easy to find and delete).
        created = kubernetes.CreatePVC(
            pvc_name=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            access_modes=["ReadWriteMany"],
            size=workspace_size,
            storage_class_name=storage_class,
        ).set_display_name("create workspace volume")
        with dsl.ExitHandler(cleanup, name="train-evaluate-publish"):
            steps(
                arguments,
                pvc_name=created.outputs["name"],
                when_done=lambda last: (
                    kubernetes.DeletePVC(pvc_name=created.outputs["name"])
                    .set_display_name("delete workspace volume")
                    .after(last)
                ),
            )

    return dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTIONS[storage])(
        declared_pipeline(training_pipeline, storage=storage, image=image)
    )


TRAIN_RETRIES = 2
"""Retries of the training step: each re-attaches to its job by its run-scoped name."""


def set_train_retry(task: "dsl.PipelineTask") -> "dsl.PipelineTask":
    """KFP retries a failed step whatever its exit code, so its retries are made cheap instead:
    the launcher restarts the job's pods itself for what is retryable (preemption, a lost node,
    exit 143 or 128-255), and a retry of the step only re-attaches. After a lost step pod it
    re-attaches at once; after a permanent failure (the trainer's exit 1-127, recorded on the
    job, or locally in the nodes' folder) it reads the record and fails in seconds, creating
    nothing. So no backoff: a wait would only delay the end of a run that failed for good (it
    was 30 s, then 60 s)."""
    return task.set_retry(num_retries=TRAIN_RETRIES, backoff_duration="0s", backoff_factor=1.0)


def requesting(task: "dsl.PipelineTask", step: str) -> "dsl.PipelineTask":
    """``task`` with the CPU and memory requests of ``step`` (``STEP_REQUESTS``)."""
    cpu, memory = STEP_REQUESTS[step]
    return task.set_cpu_request(cpu).set_memory_request(memory)


def declared_pipeline(
    pipeline_body: Callable[..., None], *, storage: str, image: str
) -> Callable[..., None]:
    """``pipeline_body(**arguments)`` as the pipeline function KFP reads: the signature and the
    docstring of the parameters declared for ``storage`` (``pipelines.parameters``); the
    parameters of another storage mode keep their defaults, as compile-time constants, so the UI
    offers no parameter that does nothing."""

    offered = declared(storage)
    fixed = {p.name: p.default_for(image) for p in PARAMETERS if p not in offered}
    declared_signature = signature(offered, image=image)

    def training_pipeline(*args: Any, **kwargs: Any) -> None:
        bound = declared_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        pipeline_body(**bound.arguments, **fixed)

    training_pipeline.__signature__ = declared_signature  # type: ignore[attr-defined]
    training_pipeline.__doc__ = docstring(
        "The parameters (see README): data, workspace, the job's size, training, gate, publish.",
        function_inputs(offered, image=image),
    )
    return training_pipeline


__all__ = ["PIPELINE_NAME", "build_training_pipeline"]
