"""The training pipeline: S3 sync → PyTorchJob (DDP) → evaluation → publish if it passed.

``build_training_pipeline(image)`` returns the ``@dsl.pipeline``; every step runs ``image`` (a
compile-time setting, like the components' factories). On a cluster the steps share a workspace
PersistentVolumeClaim mounted at ``/workspace``; locally (``run_local``, ``kfp-ddp run-local``) a
folder stands in for it and the PyTorchJob runs as local processes.

Caching. The sync step is never cached (it must look at S3 every time) and returns the digest of
the listing it synced. That digest is an input of the training step, so a scheduled run whose data
and parameters did not change gets the cached model (and cached evaluation) instead of retraining.
The trainer's output folder is derived from the configuration and the digest (not the run), so
a retried step resumes its own checkpoints and the step's inputs stay cacheable. To force a
retrain: ``kfp-ddp run --no-cache`` (caching off on every task, including those inside the exit
handler, which ``kfp.Client(enable_caching=False)`` misses, plus a fresh ``retrain_token`` so
training starts in a new folder), or pass a new ``retrain_token`` (e.g. the date) with caching
off in the UI.

kfp-kubernetes 2.17 accepts pipeline parameters for the claim name (``mount_pvc``) and the
Secret name (``use_secret_as_env``): they compile to ``pvcNameParameter`` /
``secretNameParameter``, which the KFP backend resolves at run time. The mount path must be a
compile-time string (``WORKSPACE_MOUNT_PATH``).

Credentials. S3 keys come from a Kubernetes Secret (``credentials_secret``, keys
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) attached as environment variables with
kfp-kubernetes; they are never parameters and never in the compiled YAML. ``kfp.local`` ignores
kfp-kubernetes settings, so local runs take them from the caller's environment.
"""

# No `from __future__ import annotations`: KFP reads the artifact types from real annotations.

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp import dsl
from kfp.dsl import HTML, Input, Model

from components import DEFAULT_IMAGE

PIPELINE_NAME = "kfp-ddp-training"
WORKSPACE_MOUNT_PATH = "/workspace"
"""Where the workspace PVC is mounted in every step (compile time: kfp-kubernetes wants a str)."""
TRAIN_DIR_TEMPLATE = (
    "{workspace_path}/train/{model}-s{image_size}-e{epochs}-b{batch_size}-lr{lr}"
    "-n{workers}x{nproc_per_node}-r{retrain_token}/{digest}"
)
"""The trainer's --output-dir: one folder per configuration and data digest (see the pipeline)."""


def stage_publish_folder(
    model: Input[Model],
    report: Input[HTML],
    folder: str,
    publish_uri: str,
    run_id: str,
) -> str:
    """Gather what gets published into ``folder`` and return the destination URI.

    The folder receives the model artifact's files (weights.pt, model.json, metrics.jsonl,
    summary.json), the evaluation as ``eval.json`` and its page as ``report.html``. The
    destination is ``publish_uri/<run id>/`` so every run publishes to its own prefix.
    """
    import shutil
    from pathlib import Path

    from trainer.atomic_files import write_json_atomic

    source = Path(model.path)
    target = Path(folder)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if source.is_dir():
        for item in sorted(source.iterdir()):
            if item.is_file():
                shutil.copy2(item, target / item.name)
    elif source.is_file():
        shutil.copy2(source, target / source.name)
    else:
        raise FileNotFoundError(f"model artifact {model.uri} has no files at {source}")
    evaluation = report.metadata.get("eval")
    if evaluation is not None:
        write_json_atomic(target / "eval.json", evaluation)
    if Path(report.path).is_file():
        shutil.copy2(report.path, target / "report.html")
    destination = f"{publish_uri.rstrip('/')}/{run_id}/"
    print(f"staged {sorted(p.name for p in target.iterdir())} for {destination}")
    return destination


def training_spec(
    arguments: dict[str, Any], *, run_id: str, data_digest: str, pvc_name: str | None = None
):
    """The ``TrainSpec`` the training step builds for these pipeline arguments (kubernetes).

    Mirrors the pipeline's wiring and ``components.pytorchjob.kfp_step.run_training_step`` so
    ``kfp-ddp render`` can print the PyTorchJob a run would submit without a cluster.
    """
    from components.pytorchjob import PvcMount, TrainSpec
    from components.pytorchjob.kfp_step import trainer_args_for

    a = arguments
    workspace_path = a["workspace_path"]
    data_dir = f"{workspace_path}/data"
    output_dir = TRAIN_DIR_TEMPLATE.format(**{**a, "digest": data_digest})
    overrides = json.loads(a["train_overrides"]) if a["train_overrides"].strip() else {}
    overrides.pop("backend_options", None)
    base = {
        "namespace": a["namespace"],
        "image": a["image"],
        "workers": a["workers"],
        "nproc_per_node": a["nproc_per_node"],
        "gpus_per_worker": a["gpus_per_worker"],
        "args": trainer_args_for(
            data_dir=data_dir,
            output_dir=output_dir,
            model_name=a["model"],
            epochs=a["epochs"],
            batch_size=a["batch_size"],
            lr=a["lr"],
            image_size=a["image_size"],
            checkpoint_every_steps=a["checkpoint_interval"],
            extra=a.get("trainer_args") or [],
        ),
        "run_id": run_id,
        "task_name": "train",
        "pvcs": [PvcMount(claim=pvc_name or a["workspace_pvc"], path=workspace_path)],
    }
    return TrainSpec.from_overrides(base, overrides)


def build_training_pipeline(
    image: str = DEFAULT_IMAGE,
    *,
    workspace_size: str | None = None,
    storage_class: str = "",
):
    """The training pipeline with every step on ``image``.

    Args:
        image: container image of every step (and the default image of the training replicas).
        workspace_size: ``None`` (default): the steps mount an existing claim named by the
            ``workspace_pvc`` parameter. A size such as ``"50Gi"``: the run creates its own
            ReadWriteMany claim named after the run id (``CreatePVC``) and deletes it
            (``DeletePVC``) after the last step of either branch (publish, or the evaluation
            when the gate fails). KFP allows one exit handler and an exit task may depend on no
            other task, so a run that fails midway leaves its claim behind (delete it by the
            run id). ``workspace_pvc`` is then unused. Such a pipeline cannot run under
            ``kfp.local`` (CreatePVC/DeletePVC are container components).
        storage_class: StorageClass of the created claim ('' = the cluster default).
    """
    from kfp import kubernetes

    from components.evaluate.component import make_evaluate_op
    from components.kfp_component import make_component
    from components.pytorchjob.component import make_cleanup_op, make_pytorchjob_op
    from components.s3_sync.component import make_s3_sync_op, use_s3_credentials

    sync_op = make_s3_sync_op(image)
    train_op = make_pytorchjob_op(image)
    evaluate_op = make_evaluate_op(image)
    cleanup_op = make_cleanup_op(image)
    stage_op = make_component(stage_publish_folder, image=image)

    def steps(
        *,
        pvc_name: Any,
        data_uri: Any,
        s3_endpoint: Any,
        credentials_secret: Any,
        workspace_path: Any,
        image: Any,
        namespace: Any,
        workers: Any,
        gpus_per_worker: Any,
        nproc_per_node: Any,
        model: Any,
        epochs: Any,
        batch_size: Any,
        lr: Any,
        image_size: Any,
        checkpoint_interval: Any,
        trainer_args: Any,
        train_overrides: Any,
        retrain_token: Any,
        accuracy_threshold: Any,
        baseline_uri: Any,
        tolerance: Any,
        publish_uri: Any,
        backend: Any,
        when_done: Callable[[dsl.PipelineTask], Any] | None = None,
    ) -> None:
        data_dir = f"{workspace_path}/data"

        def on_workspace(task: dsl.PipelineTask) -> dsl.PipelineTask:
            return kubernetes.mount_pvc(task, pvc_name=pvc_name, mount_path=WORKSPACE_MOUNT_PATH)

        sync = sync_op(
            source=data_uri,
            destination=data_dir,
            endpoint_url=s3_endpoint,
            include=[],
            exclude=[],
            delete=True,
        ).set_display_name("sync data from S3")
        sync.set_caching_options(False)  # must look at S3 every run; its digest drives caching
        on_workspace(sync)
        use_s3_credentials(sync, credentials_secret)

        train = train_op(
            name="",
            namespace=namespace,
            image=image,
            workers=workers,
            nproc_per_node=nproc_per_node,
            gpus_per_worker=gpus_per_worker,
            data_dir=data_dir,
            # One folder per data digest and configuration: a retried step resumes from its own
            # checkpoints, a run with other data or settings never resumes a foreign one, and
            # the path (an input) stays the same between runs so caching can work.
            output_dir=TRAIN_DIR_TEMPLATE.format(
                workspace_path=workspace_path,
                model=model,
                image_size=image_size,
                epochs=epochs,
                batch_size=batch_size,
                lr=lr,
                workers=workers,
                nproc_per_node=nproc_per_node,
                retrain_token=retrain_token,
                digest=sync.outputs["Output"],
            ),
            trainer_args=trainer_args,
            model_name=model,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            image_size=image_size,
            checkpoint_every_steps=checkpoint_interval,
            backend=backend,
            pvc_name=pvc_name,
            pvc_mount_path=workspace_path,
            data_digest=sync.outputs["Output"],
            overrides_json=train_overrides,
        ).set_display_name("train (PyTorchJob)")
        train.set_retry(num_retries=2, backoff_duration="30s", backoff_factor=2.0)
        on_workspace(train)

        evaluation = evaluate_op(
            model=train.outputs["model"],
            data_dir=data_dir,
            threshold=accuracy_threshold,
            baseline_uri=baseline_uri,
            tolerance=tolerance,
        ).set_display_name("evaluate")
        on_workspace(evaluation)
        use_s3_credentials(evaluation, credentials_secret)  # an s3:// baseline_uri needs them

        with dsl.If(evaluation.outputs["Output"] == True, name="passed"):  # noqa: E712 (KFP condition)
            stage = stage_op(
                model=train.outputs["model"],
                report=evaluation.outputs["report"],
                folder=f"{workspace_path}/publish/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}",
                publish_uri=publish_uri,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            ).set_display_name("stage model for publishing")
            # Never cached: kfp.local keys its cache on the unresolved run-id placeholder, so a
            # cache hit would hand back the previous run's destination without staging files.
            stage.set_caching_options(False)
            on_workspace(stage)
            publish = sync_op(
                source=f"{workspace_path}/publish/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}",
                destination=stage.output,
                endpoint_url=s3_endpoint,
                include=[],
                exclude=[],
                delete=False,
            ).set_display_name("publish model to S3")
            publish.set_caching_options(False)
            on_workspace(publish)
            use_s3_credentials(publish, credentials_secret)
            if when_done is not None:
                when_done(publish)
        if when_done is not None:
            with dsl.Else(name="not-passed"):
                when_done(evaluation)

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description=(
            "Sync an ImageFolder from S3 to a workspace volume, train with PyTorch DDP as a "
            "PyTorchJob, evaluate, and publish the model to S3 only if it passes the gate."
        ),
    )
    def training_pipeline(
        data_uri: str = "s3://kfp-ddp/datasets/digits",
        s3_endpoint: str = "",
        credentials_secret: str = "s3-credentials",
        workspace_pvc: str = "kfp-ddp-workspace",
        workspace_path: str = WORKSPACE_MOUNT_PATH,
        image: str = image,
        namespace: str = "",
        workers: int = 2,
        gpus_per_worker: int = 1,
        nproc_per_node: int = 1,
        model: str = "resnet18",
        epochs: int = 10,
        batch_size: int = 64,
        lr: float = 0.1,
        image_size: int = 32,
        checkpoint_interval: int = 200,
        trainer_args: list = [],  # noqa: B006 (a KFP parameter default, never mutated)
        train_overrides: str = "{}",
        retrain_token: str = "",
        accuracy_threshold: float = 0.9,
        baseline_uri: str = "",
        tolerance: float = 0.01,
        publish_uri: str = "s3://kfp-ddp/models",
        backend: str = "kubernetes",
    ) -> None:
        """The parameters (see README): data, workspace, the job's size, training, gate, publish.

        Args:
            data_uri: ``s3://bucket/prefix`` of the ImageFolder (``train/`` and ``val/``).
            s3_endpoint: S3-compatible endpoint URL ('' = AWS / the standard env).
            credentials_secret: Kubernetes Secret with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.
            workspace_pvc: existing ReadWriteMany claim shared by the steps and replicas.
            workspace_path: where the workspace is (the claim is mounted at /workspace; only
                run-local points it elsewhere).
            image: image of the training replicas.
            namespace: namespace of the PyTorchJob ('' = the pipeline's own).
            workers: replicas (1 Master + workers-1 Workers).
            gpus_per_worker: GPUs per replica (0 = CPU with gloo).
            nproc_per_node: processes per replica (usually = GPUs per worker).
            model: torchvision classification model name.
            epochs: training epochs.
            batch_size: batch size per process.
            lr: base learning rate per 256 images (scaled by the global batch).
            image_size: input image size.
            checkpoint_interval: checkpoint every N steps (and at the end).
            trainer_args: more trainer flags, e.g. ["--augment", "none", "--warmup-steps",
                "10"] (see ``python -m trainer.train --help``). Not part of the output folder's
                name: when you change them, pass a new retrain_token too (the trainer refuses
                to resume a checkpoint written with other settings).
            train_overrides: JSON object of extra TrainSpec fields (shm_size, nccl_preset,
                tolerations, scheduler_name, ...; "backend_options" for the launcher).
            retrain_token: any new value (e.g. today's date) trains from scratch in a fresh
                folder and misses the cache; ``kfp-ddp run --no-cache`` sets it for you.
            accuracy_threshold: minimum validation accuracy to publish.
            baseline_uri: previous model's metrics JSON (local or s3://) to compare against.
            tolerance: allowed accuracy drop below the baseline.
            publish_uri: ``s3://bucket/prefix``; the model goes to ``<publish_uri>/<run id>/``.
            backend: ``kubernetes`` (a PyTorchJob) or ``local`` (processes, for development).
        """
        arguments = dict(
            data_uri=data_uri,
            s3_endpoint=s3_endpoint,
            credentials_secret=credentials_secret,
            workspace_path=workspace_path,
            image=image,
            namespace=namespace,
            workers=workers,
            gpus_per_worker=gpus_per_worker,
            nproc_per_node=nproc_per_node,
            model=model,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            image_size=image_size,
            checkpoint_interval=checkpoint_interval,
            trainer_args=trainer_args,
            train_overrides=train_overrides,
            retrain_token=retrain_token,
            accuracy_threshold=accuracy_threshold,
            baseline_uri=baseline_uri,
            tolerance=tolerance,
            publish_uri=publish_uri,
            backend=backend,
        )
        cleanup = cleanup_op(
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, namespace=namespace, backend=backend
        ).set_display_name("delete leftover PyTorchJobs")
        cleanup.set_caching_options(False)
        if workspace_size is None:
            with dsl.ExitHandler(cleanup, name="train-evaluate-publish"):
                steps(pvc_name=workspace_pvc, **arguments)
            return
        # KFP allows one exit handler per pipeline and an exit task may depend on no other
        # task, so the exit handler deletes leftover PyTorchJobs (GPUs cost more than storage)
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
                pvc_name=created.outputs["name"],
                when_done=lambda last: (
                    kubernetes.DeletePVC(pvc_name=created.outputs["name"])
                    .set_display_name("delete workspace volume")
                    .after(last)
                ),
                **arguments,
            )

    return training_pipeline


# --------------------------------------------------------------------------------------------
# Local runs (kfp.local, the local PyTorchJob backend)
# --------------------------------------------------------------------------------------------


class LocalRunError(RuntimeError):
    """The local pipeline run failed; the message names the failing task and where its logs are."""


@dataclass
class LocalRun:
    """Where a local run put things."""

    run_dir: Path
    """``<pipeline_root>/<pipeline>-<timestamp>/``: one folder per task with its outputs."""
    workspace: Path
    passed: bool | None = None
    """The evaluation gate (None if the evaluation did not run)."""
    published_uri: str | None = None
    """Where the model was published (None if the gate failed)."""
    model_dir: Path | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    """The evaluation's scalar metrics (accuracy, top5, loss, ...)."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """The whole evaluation result (EvalResult.to_dict(): per-class numbers, reason, ...)."""
    training: dict[str, Any] = field(default_factory=dict)
    """The training summary metrics (images_per_sec, wall_time_s, world_size, steps, ...)."""
    cached_tasks: list[str] = field(default_factory=list)
    """Tasks kfp.local answered from its cache (their outputs are an earlier run's)."""
    report: Path | None = None
    """The evaluation's HTML page (curves, confusion matrix)."""
    data_sync: dict[str, Any] = field(default_factory=dict)
    """The data sync's report (files, bytes, transferred, digest, ...)."""

    def describe(self) -> str:
        lines = [f"run outputs: {self.run_dir}", f"workspace:   {self.workspace}"]
        for label, values in (("training:", self.training), ("evaluation:", self.metrics)):
            if values:
                shown = ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, int | float) else f"{k}={v}"
                    for k, v in sorted(values.items())
                )
                lines.append(f"{label:<12} {shown}")
        if self.report:
            lines.append(f"report:      {self.report}")
        if self.model_dir:
            lines.append(f"model:       {self.model_dir}")
        if self.passed is not None:
            lines.append(f"gate:        {'passed' if self.passed else 'failed'}")
        if self.cached_tasks:
            lines.append(
                f"from cache:  {', '.join(self.cached_tasks)} (data and settings unchanged)"
            )
        lines.append(f"published:   {self.published_uri or 'no'}")
        return "\n".join(lines)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _task_dir(run_dir: Path, task: str, cached: dict[str, Path]) -> Path | None:
    """This run's folder of ``task``, or, when kfp.local answered it from its cache, the folder
    of the earlier run whose outputs the cache handed back."""
    path = run_dir / task
    if path.is_dir():
        return path
    return cached.get(task)


class _CacheHits(logging.Handler):
    """Collects kfp.local's "Task X cache hit (key=K)" log records: task → key prefix."""

    PATTERN = re.compile(r"Task (\S+) cache hit \(key=([0-9a-f]+)\)")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.hits: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        found = self.PATTERN.search(record.getMessage())
        if found:
            self.hits[found.group(1)] = found.group(2)


def _cached_task_dirs(hits: dict[str, str], cache_root: Path) -> dict[str, Path]:
    """Task → the earlier run's task folder its cached outputs live in."""
    dirs: dict[str, Path] = {}
    for task, key in hits.items():
        for entry in sorted(cache_root.glob(f"{key}*.json")):
            outputs = _read_json(entry) or {}
            uris = [v["uri"] for v in outputs.values() if isinstance(v, dict) and v.get("uri")]
            if uris:
                dirs[task] = Path(uris[0]).parent
                break
    return dirs


def _executor_output(task_dir: Path | None) -> dict:
    if task_dir is None:
        return {}
    return _read_json(task_dir / "executor_output.json") or {}


def _artifact_metadata(executor_output: dict, name: str) -> dict[str, Any]:
    artifacts = executor_output.get("artifacts", {}).get(name, {}).get("artifacts", [])
    metadata = dict(artifacts[0].get("metadata", {})) if artifacts else {}
    metadata.pop("display_name", None)
    return metadata


def collect_local_run(
    run_dir: Path, workspace: Path, cached: dict[str, Path] | None = None
) -> LocalRun:
    """Read a finished local run's folder into a ``LocalRun`` (``cached``: task → the earlier
    run's folder for tasks kfp.local answered from its cache)."""
    cached = dict(cached or {})
    result = LocalRun(run_dir=run_dir, workspace=workspace, cached_tasks=sorted(cached))
    evaluation = _task_dir(run_dir, "evaluate-component", cached)
    if evaluation is not None:
        output = _executor_output(evaluation)
        passed = output.get("parameterValues", {}).get("Output")
        result.passed = None if passed is None else bool(passed)
        result.metrics = _artifact_metadata(output, "metrics")
        result.evaluation = _artifact_metadata(output, "report").get("eval") or {}
        report = evaluation / "report"
        result.report = report if report.is_file() else None
    sync = run_dir / "s3-sync-component"  # never cached: this run's own transfer counts
    if sync.is_dir():
        result.data_sync = _artifact_metadata(_executor_output(sync), "dataset")
    train = _task_dir(run_dir, "pytorchjob-component", cached)
    if train is not None and (train / "model").exists():
        result.model_dir = train / "model"
        result.training = _artifact_metadata(_executor_output(train), "metrics")
    stage = run_dir / "stage-publish-folder"  # never cached: only this run's counts
    if stage.is_dir():
        result.published_uri = _executor_output(stage).get("parameterValues", {}).get("Output")
    return result


def run_local(
    arguments: dict[str, Any],
    *,
    workspace: Path,
    pipeline_root: Path | None = None,
    enable_caching: bool = False,
    image: str = DEFAULT_IMAGE,
) -> LocalRun:
    """Run the pipeline with ``kfp.local`` (subprocesses, this venv) and the local backend.

    ``workspace`` stands in for the workspace PVC; S3 credentials/endpoint come from this
    process's environment (or ``arguments["s3_endpoint"]``). Raises LocalRunError on failure.
    """
    from kfp import local

    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    pipeline_root = Path(pipeline_root or workspace / "kfp-outputs").resolve()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    for forced in ("backend", "workspace_path"):
        if forced in arguments:
            raise LocalRunError(f"run_local sets {forced!r} itself; leave it out of the arguments")
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        workspace_root=str(workspace / ".kfp-workspace"),
        raise_on_error=True,
        enable_caching=enable_caching,
    )
    pipeline = build_training_pipeline(image=image)
    before = {p.name for p in pipeline_root.iterdir()}
    started = time.time()
    hits = _CacheHits()
    root_logger = logging.getLogger()
    old_level = root_logger.level
    root_logger.addHandler(hits)
    root_logger.setLevel(min(old_level, logging.INFO) if old_level else logging.INFO)
    try:
        pipeline(**arguments, backend="local", workspace_path=str(workspace))
    except Exception as exc:  # kfp.local raises RuntimeError naming the failed task
        raise LocalRunError(
            f"local pipeline run failed: {exc}; task outputs and logs under {pipeline_root}"
        ) from exc
    finally:
        root_logger.removeHandler(hits)
        root_logger.setLevel(old_level)
    new = [
        p
        for p in pipeline_root.iterdir()
        if p.is_dir()
        and p.name not in before
        and p.name.startswith(PIPELINE_NAME)
        and p.stat().st_mtime >= started - 1
    ]
    if not new:
        raise LocalRunError(f"local run finished but wrote no run folder under {pipeline_root}")
    run_dir = max(new, key=lambda p: p.stat().st_mtime)
    cached = _cached_task_dirs(hits.hits, pipeline_root / ".kfp_cache")
    return collect_local_run(run_dir, workspace, cached)


__all__ = [
    "PIPELINE_NAME",
    "WORKSPACE_MOUNT_PATH",
    "LocalRun",
    "LocalRunError",
    "build_training_pipeline",
    "collect_local_run",
    "run_local",
    "stage_publish_folder",
]
