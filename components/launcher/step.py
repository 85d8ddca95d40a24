"""The training step of a pipeline, as plain functions (unit-tested without KFP).

One source of truth: the component's parameters are the fields of ``TrainingStepInputs`` (the
component's signature and descriptions are written from them), and ``training_spec`` is the one
function that turns them into a ``TrainSpec`` — used by the step itself, by ``kfp-ddp render``
and by the tests, so what render prints is what the step submits, name included.
``run_training_step`` runs that spec and fills the ``Model`` and ``Metrics`` artifacts;
``cleanup_step`` deletes a run's leftover jobs.

What the Model artifact holds: for a PyTorch job, the trainer's four files (``MODEL_FILES``,
all required — a custom PyTorch command must write them too); for a TensorFlow or XGBoost job
(``TrainSpec.framework``), the program's own outputs (``exported_files``): everything under
``<output_dir>/model/`` kept as a tree (a ``.keras`` file, a SavedModel folder, XGBoost's
``model.json``...), plus ``summary.json`` and ``metrics.jsonl`` when it writes them — at least one
of these must exist.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import re
import shutil
import tempfile
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kfp.dsl import TaskConfig

from components import DEFAULT_IMAGE
from components.artifacts import write_metadata_file
from components.launcher.launcher import run_job
from components.launcher.names import default_namespace
from components.launcher.options import BackendOptions, options_for
from components.launcher.progress import final_progress
from components.launcher.result import JobCancelled, JobResult
from components.launcher.spec import (
    NODE_ACCESS_FIELDS,
    NODE_OUTPUT,
    STAGED_DATA,
    PvcMount,
    SpecError,
    TrainSpec,
)
from components.launcher.task_config import merge_task_config, task_gpus
from components.s3_sync import sync
from kfp_ddp.atomic_files import write_atomic
from kfp_ddp.s3_uri import s3_uri_problem
from trainer import config as trainer_config

MODEL_FILES = ("model/weights.pt", "model/model.json", "metrics.jsonl", "summary.json")
"""Our trainer's outputs, exported flat into the Model artifact."""
PROGRAM_FILES = ("metrics.jsonl", "summary.json")
"""A TensorFlow or XGBoost program's optional top-level outputs, exported beside its ``model/``
tree."""
FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "xgboost": "XGBoost"}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SUMMARY_METRICS = (
    "final_train_loss",
    "val_accuracy",
    "val_loss",
    "steps",
    "epochs",
    "world_size",
    "wall_time_s",
    "images_per_sec",
    "restarts",
    "resumed_from_step",
)


TRAINER_SETTING = "trainer_setting"
"""Metadata key of a step input that sets a trainer flag: the ``TrainConfig`` field's name."""
KFP_DEFAULT = "kfp_default"
"""Metadata key of a step input's default in the KFP component, where it differs from the
field's."""
LR_DEFAULT_WHY = (
    "the trainer's default depends on --optimizer (sgd 0.1, adamw 0.001); the pipeline trains "
    "with sgd unless trainer_args says otherwise, so it says 0.1"
)
CHECKPOINT_DEFAULT_WHY = (
    "pipeline pods are preempted and retried: more frequent checkpoints lose less of a run "
    "than the trainer's 500"
)


def trainer_setting(name: str, *, pipeline_default: Any = None, why: str = "") -> Any:
    """The field of a step input that sets the trainer's ``--<name>`` (``TrainConfig.<name>``).

    Its default, None, leaves the trainer's own default; any other value (0 and '' too) is
    passed. The pipeline declares a parameter of the same name whose default is the trainer's,
    or ``pipeline_default`` when the pipeline means another one on purpose (``why`` says why).
    """
    defaults = trainer_config.field_defaults()
    if name not in defaults:
        raise ValueError(f"trainer_setting({name!r}): TrainConfig has no field {name!r}")
    hint = typing.get_type_hints(trainer_config.TrainConfig)[name]
    if int in (hint, *typing.get_args(hint)) and defaults[name] is None:
        raise ValueError(
            f"trainer_setting({name!r}): an integer whose trainer default is None cannot be a KFP "
            "input (KFP has no None for an integer input): give the trainer a default first"
        )
    if (pipeline_default is None) != (not why):
        raise ValueError(f"trainer_setting({name!r}): a pipeline_default comes with its why")
    metadata = {TRAINER_SETTING: name, "flag": trainer_config.flag(name)}
    if int in (hint, *typing.get_args(hint)):
        # KFP has no None for an integer input (kfp.local casts it with int()): the component's
        # default is the trainer's own.
        metadata[KFP_DEFAULT] = defaults[name]
    if pipeline_default is not None:
        metadata |= {"pipeline_default": pipeline_default, "why": why}
    return field(default=None, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class TrainingStepInputs:
    """The training component's parameters: its KFP signature, defaults and input descriptions
    (KFP's UI shows each field's docstring) are written from these fields."""

    data_dir: str = ""
    """the trainer's --data-dir, as the training nodes see it (on a shared claim);
    empty with data_uri."""
    output_dir: str = ""
    """base folder of the outputs, as the nodes see it (on a shared claim); the
    trainer writes to output_dir/<settings>/<data digest>. Empty: each node's own disk,
    and the model comes back through checkpoint_uri."""
    data_uri: str = ""
    """s3://bucket/prefix every node stages onto its own disk before training (no
    shared volume); empty with data_dir."""
    checkpoint_uri: str = ""
    """s3://bucket/prefix; the trainer mirrors its checkpoints to
    checkpoint_uri/<settings>/<data digest>/checkpoints (a new pod resumes from there)
    and uploads its model to .../output. Required without output_dir."""
    s3_endpoint: str = ""
    """S3 endpoint of the nodes (MinIO, Ceph...); empty for AWS."""
    s3_credentials_secret: str = ""
    """Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY that the
    nodes get as environment variables (never values in the manifest)."""
    api: str = "auto"
    """trainjob (Trainer v2), pytorchjob (Training Operator v1), auto, tfjob
    (TensorFlow), xgboostjob (XGBoost), mpijob (MPI Operator: mpirun) or rayjob (KubeRay: Ray
    Train)."""
    name: str = ""
    """job name; empty derives one from the run and task, so a retry re-attaches."""
    namespace: str = ""
    """namespace of the job; empty means this step's own."""
    image: str = DEFAULT_IMAGE
    """image of every training node (any image with the trainer, or your own: set
    its command in overrides_json)."""
    workers: int = 1
    """training nodes (pods)."""
    nproc_per_node: int = 0
    """processes per node; 0 means one per GPU (1 without GPUs)."""
    gpus_per_worker: int = 0
    """GPUs per node."""
    cpu_request: str = ""
    """CPU request per node, e.g. 8; empty for none."""
    memory_request: str = ""
    """memory request per node, e.g. 64Gi; empty for none."""
    trainer_args: list = field(default_factory=list)
    """more trainer flags, e.g. ["--precision", "bf16"]."""
    # The trainer's settings a pipeline sets (each one a pipeline parameter of the same name):
    # None leaves the trainer's default; their types and descriptions are the trainer's. The one
    # input not named as its setting: ``model`` is the component's output artifact already.
    model_name: str | None = trainer_setting("model")
    init_from: str | None = trainer_setting("init_from")
    epochs: int | None = trainer_setting("epochs")
    batch_size: int | None = trainer_setting("batch_size")
    lr: float | None = trainer_setting("lr", pipeline_default=0.1, why=LR_DEFAULT_WHY)
    image_size: int | None = trainer_setting("image_size")
    checkpoint_every_steps: int | None = trainer_setting(
        "checkpoint_every_steps", pipeline_default=200, why=CHECKPOINT_DEFAULT_WHY
    )
    label_smoothing: float | None = trainer_setting("label_smoothing")
    skip_bad_images: bool | None = trainer_setting("skip_bad_images")
    metrics_port: int = 0
    """Prometheus metrics port of every trainer process (local rank k on
    metrics_port + k), opened on every pod with a PodMonitor and hang/throughput
    alerts beside the job; 0: off."""
    backend: str = "kubernetes"
    """kubernetes, or local (processes, for development)."""
    pvc_name: str = ""
    """claim mounted into every node; empty for none."""
    pvc_mount_path: str = ""
    """where that claim is mounted, the same path as in this step."""
    data_digest: str = ""
    """the data's listing digest (a caching key, kept in the Model's metadata)."""
    data_bytes: int = 0
    """the data set's size in bytes (sizes each node's staging volume); 0 unknown."""
    overrides_json: str = ""
    """JSON object of more TrainSpec fields, e.g. {"command": ["python",
    "my_train.py"], "shm_size": "8Gi"}, and "backend_options" for the backend; not
    the node-access fields (see cluster_settings_json)."""
    cluster_settings_json: str = ""
    """JSON object of the fields that open the node (pod_security,
    capabilities, host_network, stage_cache_host_path): whoever compiles the pipeline
    sets them; never wire a UI parameter to it."""
    retrain_token: str = ""
    """any new value trains from scratch in a fresh output folder."""
    run_id: str = ""
    """the KFP run id; empty reads it from the output artifact's URI."""
    task_name: str = "train"
    """the task name in the job's labels and default name; give every training
    task of a pipeline its own."""
    task_config: TaskConfig | None = None
    """filled by KFP's backend (2.15.0+) from the training task's own settings,
    never passed: .set_accelerator_type()/.set_accelerator_limit() (GPUs per node),
    .set_cpu_request()/.set_memory_request() and limits (per node), env,
    kubernetes.add_toleration(), add_node_selector(), add_node_affinity(), mount_pvc(),
    use_secret_as_env()... A setting also given by a parameter must agree with it."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @property
    def shared_output(self) -> bool:
        """The nodes write to a folder this step sees too (output_dir on a shared claim)."""
        return bool(self.output_dir)

    def check_storage(self) -> None:
        """Raise SpecError naming the field unless the data and outputs have one clear place."""
        if bool(self.data_dir) == bool(self.data_uri):
            raise SpecError(
                f"data_dir={self.data_dir!r}, data_uri={self.data_uri!r}: set exactly one — "
                "data_dir for data on a shared claim, data_uri (s3://bucket/prefix) for data every "
                "node stages onto its own disk"
            )

        for name in ("data_uri", "checkpoint_uri"):
            value = getattr(self, name)
            problem = value and s3_uri_problem(value, prefix_required=True)
            if problem:
                raise SpecError(
                    f"{name}={value!r} must be an s3://bucket/prefix URI ({problem})", field=name
                )
        if not self.output_dir and not self.checkpoint_uri:
            raise SpecError(
                "checkpoint_uri='' with output_dir='': without a shared claim the checkpoints "
                "and the model must go through S3; set checkpoint_uri=s3://bucket/prefix (or "
                "output_dir to a folder on pvc_name)"
            )


SPEC_FIELD_INPUTS = {
    "stage_data_uri": "data_uri",
    "stage_data_digest": "data_digest",
    "stage_data_bytes": "data_bytes",
    "pvcs": "pvc_name",
    "args": "trainer_args",
}
"""TrainSpec fields the step sets from an input of another name (any other field it sets comes
from the input of the same name)."""


def spec_field_input(spec_field: str) -> str | None:
    """The step input that sets the TrainSpec field ``spec_field``; None for a field no input
    sets (one that ``overrides_json`` may set)."""
    name = SPEC_FIELD_INPUTS.get(spec_field, spec_field)
    return name if name in TrainingStepInputs.field_names() else None


@dataclass(frozen=True)
class StepOverrides:
    """``overrides_json`` parsed: TrainSpec fields, and the backend's options as plain data."""

    spec_fields: dict[str, Any]
    backend_options: dict[str, Any]

    @classmethod
    def parse(cls, text: str) -> StepOverrides:
        try:
            data = json.loads(text) if text.strip() else {}
        except ValueError as exc:
            raise SpecError(
                f'overrides_json is not JSON ({exc}); e.g. {{"shm_size": "8Gi"}}'
            ) from exc
        if not isinstance(data, dict):
            raise SpecError(f"overrides_json={text!r} must be a JSON object")
        backend_options = data.pop("backend_options", None) or {}
        if not isinstance(backend_options, dict):
            raise SpecError("overrides_json: backend_options must be a JSON object")
        return cls(spec_fields=data, backend_options=backend_options)

    def refuse_step_inputs(self) -> None:
        """Raise SpecError naming the input if a TrainSpec field is one a step input sets: each
        setting has one place, so neither value silently wins over the other."""
        taken = {key: spec_field_input(key) for key in self.spec_fields}
        given = [f"{key!r} (the step input {name})" for key, name in taken.items() if name]
        if given:
            raise SpecError(
                f"overrides_json sets {', '.join(given)}: set the step input instead; "
                "overrides_json holds only the TrainSpec fields no input sets"
            )


def run_identity(run_id: str, artifact_uri: str) -> str:
    """The KFP run id of the running task: given, else the run UUID in its output's URI.

    KFP writes outputs under ``<root>/<pipeline>/<run id>/<task>/...``; a retry of the step keeps
    the run id, so the job it derives its name from is found again. Without a UUID (kfp.local:
    ``<root>/<run name>/<task>/<output>``) the run's folder name stands in.
    """
    if run_id:
        return run_id
    uri = artifact_uri.rstrip("/")
    found = UUID.search(uri)
    if found:
        return found.group(0)
    parts = [p for p in uri.split("/") if p]
    return parts[-3] if len(parts) >= 3 else uri


def run_folder(inputs: TrainingStepInputs) -> str:
    """The trainer's --output-dir: OUTPUT_DIR/<settings>/<data digest> (see ``run_key``); without
    output_dir, the same under each node's own ``NODE_OUTPUT``."""
    return f"{(inputs.output_dir or NODE_OUTPUT).rstrip('/')}/{run_key(inputs)}"


def run_uri(inputs: TrainingStepInputs) -> str:
    """CHECKPOINT_URI/<settings>/<data digest> ('' without checkpoint_uri): the run's S3 folder,
    with ``checkpoints/`` (the trainer's mirror) and ``output/`` (its model and summary)."""
    if not inputs.checkpoint_uri:
        return ""
    return f"{inputs.checkpoint_uri.rstrip('/')}/{run_key(inputs)}"


NAMED_IN_RUN_KEY = ("model_name", "image_size", "epochs", "batch_size", "lr")
"""The settings the run's folder names (the rest go into its digest)."""


def run_key(inputs: TrainingStepInputs) -> str:
    """<settings>/<data digest>: the folder of one configuration trained on one data set.

    The settings part is readable (model, size, epochs, batch, lr, nodes x processes) and ends in
    a digest of everything else that changes what is trained (trainer_args, the TrainSpec
    overrides, retrain_token), so changing any of them starts a new folder instead of failing to
    resume a checkpoint of other settings.
    """
    overrides = StepOverrides.parse(inputs.overrides_json).spec_fields
    # The trainer's settings that change what is trained (beyond those named in the folder),
    # when set to another value than the trainer's default: what trains the same keeps its key.
    defaults = trainer_config.field_defaults()
    changed = [
        [f.name, getattr(inputs, f.name)]
        for f in fields(inputs)
        if f.metadata.get(TRAINER_SETTING) in trainer_config.TRAJECTORY_SETTINGS
        and f.name not in NAMED_IN_RUN_KEY
        and getattr(inputs, f.name) not in (None, defaults[f.metadata[TRAINER_SETTING]])
    ]
    extra = json.dumps(
        [list(inputs.trainer_args or []), overrides, inputs.retrain_token, *changed],
        sort_keys=True,
    )

    nproc = inputs.nproc_per_node or inputs.gpus_per_worker or task_gpus(inputs.task_config) or 1
    settings = (
        f"{inputs.model_name or 'default'}-s{inputs.image_size or 'd'}-e{inputs.epochs or 'd'}"
        f"-b{inputs.batch_size or 'd'}-lr{inputs.lr or 'd'}-n{inputs.workers}x{nproc}"
        f"-{hashlib.sha256(extra.encode()).hexdigest()[:8]}"
    )
    digest = re.sub(r"[^A-Za-z0-9._-]", "-", inputs.data_digest or "no-digest")[:16]
    return f"{settings}/{digest}"


def trainer_flag_inputs(inputs_class: type = TrainingStepInputs) -> dict[str, str]:
    """{step input: the trainer flag it sets} (the fields with a ``flag`` in their metadata)."""
    return {f.name: f.metadata["flag"] for f in fields(inputs_class) if "flag" in f.metadata}


def flag_args(flag: str, value: Any) -> list[str]:
    """``value`` of the trainer's ``flag`` as arguments: a switch (a bool) is ``--name`` or
    ``--no-name``, anything else ``--name value``."""
    if isinstance(value, bool):
        return [flag if value else f"--no-{flag.removeprefix('--')}"]
    return [flag, str(value)]


def trainer_args_for(inputs: TrainingStepInputs) -> list[str]:
    """The trainer's flags: each trainer setting that is not None, then ``trainer_args``."""
    data_dir = STAGED_DATA if inputs.data_uri else inputs.data_dir
    args = ["--data-dir", data_dir, "--output-dir", run_folder(inputs)]
    if inputs.checkpoint_uri:
        args += ["--checkpoint-uri", f"{run_uri(inputs)}/checkpoints"]
        args += ["--output-uri", f"{run_uri(inputs)}/output"]
    for name, flag in trainer_flag_inputs(type(inputs)).items():
        value = getattr(inputs, name)
        if value is not None:
            args += flag_args(flag, value)
    return args + [str(a) for a in inputs.trainer_args or []]


def training_spec(inputs: TrainingStepInputs, *, run_id: str) -> TrainSpec:
    """The TrainSpec the step submits for ``inputs`` in the run ``run_id`` (one function for the
    step, ``render`` and the tests)."""
    inputs.check_storage()
    overrides = StepOverrides.parse(inputs.overrides_json)
    overrides.refuse_step_inputs()
    base: dict[str, Any] = {
        "api": inputs.api,
        "name": inputs.name,
        "namespace": inputs.namespace,
        "image": inputs.image,
        "workers": inputs.workers,
        "nproc_per_node": inputs.nproc_per_node or None,
        "gpus_per_worker": inputs.gpus_per_worker,
        "cpu_request": inputs.cpu_request or None,
        "memory_request": inputs.memory_request or None,
        "args": trainer_args_for(inputs),
        "metrics_port": inputs.metrics_port,
        "run_id": run_id,
        "task_name": inputs.task_name,
    }
    if inputs.data_uri or inputs.checkpoint_uri:
        # Only nodes that talk to S3 get the keys: a Secret missing in the job's namespace
        # must not keep nodes that never use it from starting.
        base["s3_endpoint"] = inputs.s3_endpoint or None
        base["s3_credentials_secret"] = inputs.s3_credentials_secret or None
    if inputs.data_uri:
        base["stage_data_uri"] = inputs.data_uri
        if re.fullmatch(r"[0-9a-f]{64}", inputs.data_digest):
            base["stage_data_digest"] = inputs.data_digest
        if inputs.data_bytes:
            base["stage_data_bytes"] = inputs.data_bytes
    if inputs.pvc_name and inputs.backend == "kubernetes":
        # Locally the processes share this step's filesystem, where the paths already hold.
        base["pvcs"] = [PvcMount(claim=inputs.pvc_name, path=inputs.pvc_mount_path or "/workspace")]
    cluster = cluster_settings(inputs.cluster_settings_json)
    opened = sorted(set(overrides.spec_fields) & set(NODE_ACCESS_FIELDS))
    if opened:
        raise SpecError(
            f"overrides_json sets {opened}: these open the node (Pod Security level, "
            "capabilities, the node's network or file system) and are set only by whoever "
            "compiles the pipeline: cluster_settings_json (build_training_pipeline("
            "cluster_settings=...), kfp-ddp compile --cluster-settings)"
        )

    given = merge_task_config(
        inputs.task_config, parameters=base, overrides=overrides.spec_fields, cluster=cluster
    )
    return TrainSpec.from_overrides(base, given)


def cluster_settings(text: str) -> dict[str, Any]:
    """``cluster_settings_json`` parsed (a JSON object of TrainSpec fields)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise SpecError(f"cluster_settings_json is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise SpecError(f"cluster_settings_json={text!r} must be a JSON object")
    return data


def backend_options_for(inputs: TrainingStepInputs) -> BackendOptions:
    """The backend's typed options from ``overrides_json``'s ``backend_options``."""
    data = dict(StepOverrides.parse(inputs.overrides_json).backend_options)
    data.setdefault("output_dir", run_folder(inputs))
    return options_for(inputs.backend, data)


def run_training_step(inputs: TrainingStepInputs, *, model: Any, metrics: Any) -> JobResult:
    """Run the training job and fill ``model`` (Output[Model]) and ``metrics`` (Output[Metrics])."""
    options = backend_options_for(inputs)
    spec = training_spec(inputs, run_id=run_identity(inputs.run_id, getattr(model, "uri", "")))
    print(f"[launcher] {inputs.backend} job {spec.namespace}/{spec.name}, run {spec.run_id}")
    try:
        result = run_job(spec, backend=inputs.backend, options=options)
    except JobCancelled as exc:
        print(f"[launcher] {exc}")
        raise SystemExit(143) from exc
    with _trainer_outputs(inputs) as outputs:
        export_model(outputs, Path(model.path), framework=spec.framework)
        result = dataclasses.replace(
            result, summary=_read_json(outputs / "summary.json") or result.summary
        )
    _fill_artifacts(result, inputs, model, metrics)
    return result


@contextlib.contextmanager
def _trainer_outputs(inputs: TrainingStepInputs) -> Iterator[Path]:
    """The trainer's output folder as this step sees it: the shared one, or (no shared claim) a
    temporary download of what the trainer uploaded to ``run_uri(inputs)/output``."""
    if inputs.shared_output:
        yield Path(run_folder(inputs))
        return

    with tempfile.TemporaryDirectory(prefix="kfp-ddp-model-") as tmp:
        source = f"{run_uri(inputs)}/output/"
        report = sync(source, tmp, endpoint_url=inputs.s3_endpoint or None, progress=False)
        print(f"[launcher] the trainer's outputs from {source}: {report.summary()}")
        yield Path(tmp)


def tensorboard_location(inputs: TrainingStepInputs) -> str:
    """Where the trainer's TensorBoard files are: its output folder's ``tensorboard/`` on the
    shared claim, or (no shared claim) their upload, ``<run output URI>/tensorboard``."""
    if inputs.shared_output:
        return f"{run_folder(inputs)}/tensorboard"
    return f"{run_uri(inputs)}/output/tensorboard"


def _fill_artifacts(result: JobResult, inputs: TrainingStepInputs, model: Any, metrics: Any):
    summary = result.summary or {}
    model_json = _read_json(Path(model.path) / "model.json")
    model.metadata.update(
        {
            "arch": model_json.get("arch", summary.get("arch", "")),
            "val_accuracy": finite_number(summary.get("val_accuracy")),
            "data_digest": inputs.data_digest,
            "job_name": result.name,
            "job_api": result.api,
            "world_size": summary.get("world_size"),
            "restarts": result.restarts,
            "tensorboard": tensorboard_location(inputs),
        }
    )
    for key_name in SUMMARY_METRICS:
        value = summary.get(key_name)
        if (number := finite_number(value)) is not None:
            metrics.log_metric(key_name, number)
        elif isinstance(value, float):  # nan or inf: KFP's metadata cannot hold it
            print(f"[launcher] Metrics: the trainer's {key_name} is {value}, left out")
    skipped = skipped_images(summary)
    if skipped is not None:
        model.metadata["skipped_images"] = skipped
        metrics.log_metric("skipped_images", float(skipped))
    progress = final_progress(summary, result.trainer_status)
    if progress is not None:  # by the names the trainer reports; a figure in both: as logged
        shown = progress.report.line()
        print(f"[launcher] Metrics: the trainer's final progress ({progress.source}): {shown}")
        for name, number in progress.report.metrics().items():
            metrics.log_metric(name, number)
    metrics.log_metric("job_duration_s", float(result.duration_s))
    metrics.log_metric("job_restarts", float(result.restarts))

    write_metadata_file(metrics)


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None: KFP refuses to
    store nan or inf in an artifact's metadata ("Fail to serialize NaN"), which failed the step
    after a training of one's own reported one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def skipped_images(summary: dict) -> int | None:
    """How many unreadable images the trainer left out (``summary.json``'s ``skipped_images``,
    with ``skip_bad_images``); None from a trainer that does not say (the user's own program)."""
    skipped = summary.get("skipped_images")
    count = skipped.get("count") if isinstance(skipped, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def exported_files(output_dir: Path, framework: str) -> list[tuple[Path, str]]:
    """(source file, its path in the Model artifact) of what the step exports for a program of
    ``framework`` (``TrainSpec.framework``)."""
    volume_hint = (
        "did the job write to the same volume this step mounts (pvc_name / pvc_mount_path), or "
        "upload to checkpoint_uri?"
    )
    if framework not in FRAMEWORK_NAMES:
        missing = [f for f in MODEL_FILES if not (output_dir / f).is_file()]
        if missing:
            raise FileNotFoundError(
                f"the trainer's outputs in {str(output_dir)!r} lack {missing}: {volume_hint}"
            )
        return [(output_dir / rel, Path(rel).name) for rel in MODEL_FILES]
    model = output_dir / "model"
    found = [(p, p.relative_to(model).as_posix()) for p in sorted(model.rglob("*")) if p.is_file()]
    clashes = sorted({name for _, name in found} & set(PROGRAM_FILES))
    if clashes:
        raise FileExistsError(
            f"{model}/ holds {clashes}, which the program's top-level {clashes} would overwrite "
            "in the Model artifact: rename one"
        )
    found += [(output_dir / n, n) for n in PROGRAM_FILES if (output_dir / n).is_file()]
    if not found:
        raise FileNotFoundError(
            f"the {FRAMEWORK_NAMES[framework]} program wrote nothing to export: "
            f"output_dir={str(output_dir)!r} has no model/ files and none of "
            f"{list(PROGRAM_FILES)} (the program should save its model under "
            f"<--output-dir>/model/); {volume_hint}"
        )
    return found


def export_model(output_dir: Path, model_dir: Path, *, framework: str = "pytorch") -> None:
    """Copy the job's outputs (``exported_files``) into the Model artifact folder, each
    atomically."""

    model_dir.mkdir(parents=True, exist_ok=True)
    for source, name in exported_files(output_dir, framework):
        (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb") as handle:
            write_atomic(model_dir / name, functools.partial(shutil.copyfileobj, handle))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cleanup_step(*, run_id: str, namespace: str, backend: str, options=None) -> int:
    """Delete the run's jobs of every API (kubernetes backend); returns how many."""
    if backend != "kubernetes" or not run_id:
        print(f"[cleanup] backend={backend!r}, run_id={run_id!r}: no jobs to delete")
        return 0
    # Here, not at the top: the Kubernetes client (~0.9 s) is the cleanup's alone; importing the
    # step's module (the CLI, the compiler, the local backend) must not pay for it.
    from components.launcher.backends.kubernetes import delete_run_jobs

    deleted = delete_run_jobs(namespace or default_namespace(), run_id, options=options)
    print(f"[cleanup] deleted {len(deleted)} job(s) of run {run_id}: {deleted}")
    return len(deleted)
